"""Every option of every ``gpuir`` command says what it does and what its default is, in plain text.

The walk covers every parser reachable from :func:`gpuir.cli.build_parser`
(index, search, info, demo, memory ..., parity, eval ..., and serve when the
service extra's module is present), so a new option without help fails here.
"""

from __future__ import annotations

import argparse
import re

import pytest

from gpuir.cli import build_parser, main

#: Sphinx / reStructuredText markup that must never reach a terminal.
MARKUP = re.compile(r"``|:(?:func|class|meth|mod|attr|data|obj|ref|doc):`")



def _walk(parser: argparse.ArgumentParser, path: str):
    yield path, parser
    seen = set()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                if id(sub) not in seen:
                    seen.add(id(sub))
                    yield from _walk(sub, f"{path} {name}")


def _parsers():
    return list(_walk(build_parser(), "gpuir"))


def _param(path, parser):
    return pytest.param(path, parser, id=path)


PARSERS = _parsers()


def _required(parser: argparse.ArgumentParser, action: argparse.Action) -> bool:
    if action.required:
        return True
    return any(action in g._group_actions and g.required for g in parser._mutually_exclusive_groups)


def problems(parser: argparse.ArgumentParser) -> list[str]:
    """What is wrong with one parser's options: missing help, an invisible default, markup."""
    out = []
    for a in parser._actions:
        if isinstance(a, (argparse._HelpAction, argparse._VersionAction, argparse._SubParsersAction)):
            continue
        name = "/".join(a.option_strings) or a.dest
        if not a.help or a.help == argparse.SUPPRESS:
            out.append(f"{name}: no help text")
            continue
        if a.option_strings and a.nargs != 0 and not _required(parser, a):
            text = a.help % {**vars(a), "default": a.default, "prog": parser.prog}
            if "default" not in text:
                out.append(f"{name}: the default is not shown ({a.help!r})")
        if callable(a.default) or "<function" in str(a.default):
            out.append(f"{name}: the default is a function object ({a.default!r})")
    text = parser.format_help()
    if MARKUP.search(text):
        out.append(f"markup in help: {MARKUP.search(text).group(0)!r}")
    if "<function" in text:
        out.append("a function object is printed in the help")
    return out


def test_the_walk_reaches_every_command():
    paths = {p for p, _ in PARSERS}
    for expected in ("gpuir index", "gpuir search", "gpuir info", "gpuir demo", "gpuir memory add",
                     "gpuir memory delete", "gpuir memory search", "gpuir memory info"):
        assert expected in paths


def test_the_service_commands_are_hooked_in_when_present():
    import gpuir.cli

    try:
        from gpuir.service.cli import add_parsers
    except ImportError:
        assert gpuir.cli._service_parsers is None
        pytest.skip("gpuir.service.cli is not importable here (the service extra or module is absent)")
    assert gpuir.cli._service_parsers is add_parsers
    assert "gpuir serve" in {p for p, _ in PARSERS}


@pytest.mark.parametrize(("path", "parser"), [_param(p, q) for p, q in PARSERS])
def test_every_option_has_help_and_a_visible_default(path, parser):
    bad = problems(parser)
    assert not bad, f"{path}: " + "; ".join(bad)


def test_the_check_can_fail():
    p = argparse.ArgumentParser(prog="x")
    p.add_argument("--n", type=int, default=3)
    p.add_argument("--m", type=int, default=3, help="how many")
    p.add_argument("--f", default=None, help="see ``gpuir.f`` (default: %(default)s)")
    p.add_argument("--g", default=len, help="a function (default: %(default)s)")
    bad = " | ".join(problems(p))
    assert "--n: no help text" in bad and "--m: the default is not shown" in bad
    assert "markup" in bad and "function object" in bad


@pytest.mark.parametrize("argv", [["index", "--help"], ["search", "--help"], ["memory", "search", "--help"]])
def test_help_prints_and_exits_0(argv, capsys):
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "(default: " in out and not MARKUP.search(out)
