"""The performance model: a trace's step split into the iteration model's terms, its
gradients and collectives, simulated on N workers (synchronous data parallel, parameter
servers, FSDP), its what-ifs. A room above the analyses: it reads the events table and the
analyses' breakdowns; the analyses and the core import nothing from it (but the bench
matrix, which puts predictions beside measured runs)."""
