"""`opprof record`'s options are declared once, as the fields of RecordConfig: the click
options are made from them (help, bounds, choices, defaults), what click parses becomes the
config, and a field added to a configuration is an option with nothing else to edit."""

from __future__ import annotations

import dataclasses
from typing import Any

import click
import pytest
from click.testing import CliRunner

from opprof.collectors.config import (
    MODELS,
    RecordConfig,
    Rendezvous,
    option,
    options_of,
)
from opprof.commands import config_options
from opprof.commands.record import command as record_command
from opprof.kinds import FRAMEWORKS, Device, Framework, Mode


def _params(cmd: click.Command) -> dict[str, click.Parameter]:
    return {p.name: p for p in cmd.params if p.name}


def test_every_config_field_is_an_option_with_its_help() -> None:
    params = _params(record_command)
    declared = options_of(RecordConfig)
    assert {name for name, _, _ in declared} == {
        f.name for f in dataclasses.fields(RecordConfig)
        if f.name not in ("rendezvous", "command")} | {
        f.name for f in dataclasses.fields(Rendezvous) if f.name != "clock_sync"}
    for name, _, how in declared:
        assert name in params, name
        p = params[name]
        assert isinstance(p, click.Option)
        assert (p.help or "") == how.help, name
    # the options only the command has: where to write, how to print
    assert set(params) - {n for n, _, _ in declared} == {"output", "top", "fmt"}


def test_option_types_bounds_and_defaults_come_from_the_fields() -> None:
    params = _params(record_command)
    assert params["fw"].required and list(params["fw"].type.choices) == list(FRAMEWORKS)
    assert list(params["model"].type.choices) == list(MODELS)
    assert params["batch_size"].default == 32 and params["batch_size"].type.min == 1
    assert params["warmup"].type.min == 0
    assert params["master_port"].type.max == 65535
    assert params["device"].default == Device.CPU.value
    assert params["mode"].default is None  # unset: derived from the workers and framework
    assert params["timeout_s"].opts == ["--timeout"]
    assert params["memory_interval_s"].opts == ["--memory-interval"]
    assert params["nsys"].is_flag and params["nsys"].default is False
    assert params["profile_memory"].secondary_opts == ["--no-profile-memory"]


def _parsed(*argv: str) -> dict[str, Any]:
    """What click parses of a record command line, as the command gets it."""
    ctx = record_command.make_context("record", list(argv))
    values = dict(ctx.params)
    for name in ("output", "top", "fmt"):
        values.pop(name)
    return values


def test_the_command_line_becomes_the_config() -> None:
    c = RecordConfig.from_options(_parsed("--fw", "torch", "--model", "lenet5"))
    assert c == RecordConfig(fw=Framework.TORCH, model="lenet5")
    c = RecordConfig.from_options(_parsed(
        "--fw", "mxnet", "--model", "resnet18", "--workers", "3", "--batch-size", "8",
        "--no-profile-memory", "--memory-interval", "0", "--timeout", "30",
        "--nnodes", "2", "--node-rank", "1", "--master-port", "29500",
        "--cluster", "a:1, b:2"), command="opprof record …")
    assert c.mode == Mode.PS_SYNC  # MXNet's usual for several workers
    assert (c.workers, c.batch_size, c.profile_memory, c.memory_interval_s, c.timeout_s) == \
        (3, 8, False, 0.0, 30.0)
    assert c.rendezvous == Rendezvous(nnodes=2, node_rank=1, master_port=29500,
                                      cluster=("a:1", "b:2"))
    assert c.command == "opprof record …"
    assert RecordConfig.from_options(_parsed("--fw", "torch", "--model", "lenet5",
                                             "--workers", "2")).mode == Mode.ALLREDUCE
    assert RecordConfig.from_options(_parsed("--fw", "torch", "--model", "lenet5",
                                             "--workers", "2", "--mode", "fsdp")).mode == \
        Mode.FSDP


def test_bad_values_are_refused_by_the_command_line() -> None:
    runner = CliRunner()
    for argv in (["--fw", "torch", "--model", "nope"], ["--fw", "torch", "--model", "lenet5",
                                                        "--batch-size", "0"],
                 ["--fw", "torch", "--model", "lenet5", "--master-port", "70000"]):
        r = runner.invoke(record_command, argv)
        assert r.exit_code == 2 and "Invalid value" in r.output, r.output


def test_a_field_added_to_a_configuration_is_an_option() -> None:
    """Adding an option is one edit: a field declared with option()."""

    @dataclasses.dataclass(frozen=True)
    class Config:
        name: str = option(help="A name.")
        count: int = option(4, minimum=1, help="How many.")
        ratio: float | None = option(None, minimum=0, min_open=True, help="A ratio.")
        fast: bool = option(False, help="Go fast.")
        careful: bool = option(True, help="Be careful.")
        mode: Mode = option(Mode.SINGLE, help="A mode.")
        internal: str = ""  # no option

    @click.command()
    @config_options(Config)
    def cmd(**values: Any) -> None:
        click.echo(repr(Config(**values)))

    r = CliRunner().invoke(cmd, ["--name", "x", "--count", "2", "--ratio", "0.5", "--fast",
                                 "--no-careful", "--mode", "fsdp"])
    assert r.exit_code == 0, r.output
    assert r.output.strip() == repr(Config("x", 2, 0.5, True, False, "fsdp"))  # type: ignore[arg-type]
    assert CliRunner().invoke(cmd, ["--name", "x", "--ratio", "0"]).exit_code == 2
    helped = CliRunner().invoke(cmd, ["--help"]).output
    for text in ("A name.", "How many.", "--fast", "--careful / --no-careful", "fsdp"):
        assert text in helped
    assert "--internal" not in helped


@pytest.mark.parametrize("name", ["profile_memory", "memory_interval_s"])
def test_run_takes_its_memory_options_from_the_same_fields(name: str) -> None:
    from opprof.commands.run import command as run_command

    mine, theirs = _params(run_command)[name], _params(record_command)[name]
    assert (mine.opts, mine.help, mine.default) == (theirs.opts, theirs.help, theirs.default)
