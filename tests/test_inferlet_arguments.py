"""The Python SDK's command line (sdk/python/inferlet/arguments.py): argparse inside the inferlet.

On the host: the value types and their errors. In wasm, for every library inferlet that parses its
arguments with it: ``--help`` prints the help on stdout and ends with status 0, an unknown option is a
usage error (the usage and one error line on stderr, status 2), and an option is never taken by an
abbreviation. Each inferlet's own test checks its bounds.
"""

from __future__ import annotations

import argparse

import pytest
from harness import events_of, refused, run
from test_sdk_python import load

arguments = load("arguments")

# The library inferlets whose command line is an inferlet.ArgumentParser.
PROGRAMS = ["mirostat"]


def test_whole_numbers_keep_their_bounds():
    assert arguments.whole(1)("3") == 3 and arguments.whole(0, 2)("0") == 0
    for convert, value, bounds in [(arguments.whole(1), "0", ">= 1"), (arguments.whole(1), "2.5", ">= 1"),
                                   (arguments.whole(0, 2), "3", "from 0 to 2"), (arguments.whole(0), "x", ">= 0")]:
        with pytest.raises(argparse.ArgumentTypeError) as err:
            convert(value)
        assert str(err.value) == f"expected a whole number {bounds}, not {value!r}"


def test_numbers_keep_their_bounds_and_refuse_what_is_not_finite():
    assert arguments.number(0, 1)("1") == 1.0 and arguments.number(above=0)("1e-9") == 1e-9
    assert arguments.number()("-3.5") == -3.5
    for convert, value, bounds in [(arguments.number(0, 1), "1.5", " >= 0 and <= 1"),
                                   (arguments.number(above=0, high=64), "0", " > 0 and <= 64"),
                                   (arguments.number(above=0), "nan", " > 0"), (arguments.number(), "inf", ""),
                                   (arguments.number(0), "x", " >= 0")]:
        with pytest.raises(argparse.ArgumentTypeError) as err:
            convert(value)
        assert str(err.value) == f"expected a number{bounds}, not {value!r}"


def test_text_must_not_be_empty():
    assert arguments.text(" a ") == " a "
    for value in ("", "  \n"):
        with pytest.raises(argparse.ArgumentTypeError, match="must not be empty"):
            arguments.text(value)


def test_the_parser_takes_options_anywhere_never_abbreviated_and_exits_as_a_program():
    parser = arguments.ArgumentParser("demo", "demo: What it does.\n\nMore detail.")
    parser.add_argument("parts", nargs="+")
    parser.add_argument("--max-tokens", type=arguments.whole(1), default=4)
    assert vars(parser.parse(["a", "--max-tokens", "2", "b"])) == {"parts": ["a", "b"], "max_tokens": 2}
    assert parser.description == "What it does."
    for args, status in [(["a", "--max", "2"], 2), (["--help"], 0)]:
        with pytest.raises(SystemExit) as exited:
            parser.parse(args)
        assert exited.value.code == status


@pytest.mark.parametrize("program", PROGRAMS)
def test_help_is_printed_and_ends_with_status_0(loop, program):
    (inst,) = run(loop, program, [["--help"]])
    assert (inst.exit_code, inst.error) == (0, None)
    help_text = "".join(events_of(loop, inst, "stdout"))
    assert help_text.startswith(f"usage: {program} [-h]") and "-h, --help" in help_text


@pytest.mark.parametrize("program", PROGRAMS)
def test_an_unknown_or_abbreviated_option_is_a_usage_error(loop, program):
    for stderr in refused(loop, program, [["--no-such-option"], ["--max", "3"]]):
        usage, error = stderr.splitlines()[0], stderr.splitlines()[-1]
        assert usage.startswith(f"usage: {program} [-h]") and error.startswith(f"{program}: error: ")
        assert "unrecognized arguments: --" in error or "the following arguments are required" in error
