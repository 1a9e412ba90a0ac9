"""opprof's version: one place, read by the package's face, the CLI, the `.trace` stamp and
the HTML page (none of which then imports the package's face)."""

__version__ = "0.1.0"
