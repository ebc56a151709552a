"""The Python SDK's command line (sdk/python/inferlet/arguments.py): argparse inside the inferlet.

On the host: the value types and their errors. In wasm, for every library inferlet that parses its
arguments with it: ``--help`` prints the help on stdout and ends with status 0, and an unknown or
abbreviated option is a usage error (the usage and one error line on stderr, status 2). Each inferlet's
own test checks its bounds and messages.
"""

from __future__ import annotations

import argparse

import pytest
from harness import built, events_of, refused, run
from test_sdk_python import load

from oven.client.paths import inferlets_dir

arguments = load("arguments")

# The library inferlets whose command line is an inferlet.ArgumentParser. Each is stored by its own test
# (not the module's loop fixture): one is compiled when its test runs unless another test has, instead of
# all of them, one after another, before the first test.
PARSING = sorted(app.parent.name for app in inferlets_dir().glob("*/app.py")
                 if "inferlet.ArgumentParser(" in app.read_text())


def test_whole_numbers_keep_their_bounds():
    assert arguments.whole(1)("3") == 3 and arguments.whole(0, 2)("0") == 0
    for convert, value, bounds in [(arguments.whole(1), "0", ">= 1"), (arguments.whole(1), "2.5", ">= 1"),
                                   (arguments.whole(0, 2), "3", "from 0 to 2"), (arguments.whole(0), "x", ">= 0")]:
        with pytest.raises(argparse.ArgumentTypeError) as err:
            convert(value)
        assert str(err.value) == f"expected a whole number {bounds}, not {value!r}"


def test_numbers_keep_their_bounds_and_refuse_what_is_not_finite():
    assert arguments.number(0, 1)("1") == 1.0 and arguments.number(above=0)("1e-9") == 1e-9
    assert arguments.number()("-3.5") == -3.5 and arguments.number(above=0, below=1)("0.25") == 0.25
    for convert, value, bounds in [(arguments.number(0, 1), "1.5", " >= 0 and <= 1"),
                                   (arguments.number(above=0, high=64), "0", " > 0 and <= 64"),
                                   (arguments.number(above=0, below=1), "1", " > 0 and < 1"),
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


def test_regex_compiles_and_refuses_bad_or_long_patterns():
    assert arguments.regex()(r"\d+").fullmatch("42") and arguments.regex(3)("abc").pattern == "abc"
    with pytest.raises(argparse.ArgumentTypeError, match=r"^not a regular expression: missing \)"):
        arguments.regex()("(")
    with pytest.raises(argparse.ArgumentTypeError, match="^longer than 3 characters$"):
        arguments.regex(3)("abcd")


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


@pytest.mark.parametrize("program", PARSING)
def test_help_ends_with_status_0_and_a_mistake_with_status_2(loop, program):
    """``--help`` prints the help on stdout; an unknown option, or one abbreviated, is refused (status 2,
    the usage and one error line on stderr) whatever else the command line lacks."""
    loop.programs.add(built(program), program)
    (helped,) = run(loop, program, [["--help"]])
    assert (helped.exit_code, helped.error) == (0, None)
    help_text = "".join(events_of(loop, helped, "stdout"))
    assert help_text.startswith(f"usage: {program} [-h]") and "-h, --help" in help_text
    for stderr in refused(loop, program, [["--no-such-option"], ["--max", "3"]]):
        lines = stderr.splitlines()
        assert lines[0].startswith(f"usage: {program} [-h]") and lines[-1].startswith(f"{program}: error: ")
