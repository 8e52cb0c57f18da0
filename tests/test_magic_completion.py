"""Tab after `%neuron` / `%%neuron` in a real IPython shell, through IPython's own completer: the commands each form
takes, a command's options, option values (choices, the namespace's variables, paths); and "did you mean" for a
mistyped command, choice or option."""

from __future__ import annotations

import pytest
from IPython.core.completer import provisionalcompleter
from IPython.core.error import UsageError
from shells import run

from neuron_lab.extension import session_of
from neuron_lab.magics import parser


def offered(sh, text: str) -> list[str]:
    """What Tab offers at the end of ``text`` (a cell up to the cursor), as a frontend asks IPython for it."""
    with provisionalcompleter():
        completions = list(sh.Completer.completions(text, len(text)))
    assert all(c.end == len(text) for c in completions)
    return [text[:c.start] + c.text for c in completions]  # what the line reads once one is picked


def words(sh, text: str) -> list[str]:
    """The words Tab offers in place of the last one of ``text``."""
    return [line.rpartition(" ")[2] for line in offered(sh, text)]


def test_the_first_word_offers_the_commands_of_that_form_not_other_magics(shell):
    assert words(shell, "%neuron d") == ["device", "dashboard"]
    assert words(shell, "%%neuron d") == ["device"]  # dashboard is a line magic
    assert words(shell, "%%neuron c") == ["compile", "compare"]
    p = parser.build()
    assert words(shell, "%neuron ") == parser.commands_for(p, cell=False)
    assert words(shell, "%%neuron ") == parser.commands_for(p, cell=True)
    assert set(words(shell, "%neuron ")) | set(words(shell, "%%neuron ")) == set(p.subcommands)
    assert offered(shell, "x = 1\n%neuron rep") == ["x = 1\n%neuron report"]
    assert offered(shell, "r = %neuron rep") == ["r = %neuron report"]


def test_a_cell_magic_completes_on_the_first_line_only(shell):
    assert "device" not in words(shell, "x = 1\n%%neuron d")


def test_options_of_the_command_being_typed_and_not_those_given(shell):
    assert words(shell, "%neuron report --") == ["--last", "--full", "--summary", "--json"]
    assert words(shell, "%neuron report --last --") == ["--full", "--summary", "--json"]
    assert words(shell, "%neuron device cpu --m") == ["--move"]
    assert words(shell, "%%neuron compile --") == ["--fullgraph", "--backend", "--dynamic", "--device"]
    assert words(shell, "%%neuron ranks --r") == ["--restart", "--row-limit"]
    assert words(shell, "%neuron memory --") == ["--live"]
    assert words(shell, "%%neuron profile --") == ["--export", "--row-limit"]


def test_values_from_choices_and_from_the_namespace(shell):
    run(shell, "import torch\nmodel = torch.nn.Linear(2, 2)\nmask = torch.ones(2)\nmessage = 'hi'")
    assert words(shell, "%neuron mode ") == ["default", "eager", "compile"]
    assert words(shell, "%neuron ranks s") == ["start", "stop"]
    assert words(shell, "%neuron dashboard ") == ["memory", "tensors", "fallbacks", "compiles"]
    assert words(shell, "%neuron device cpu --move m") == ["mask", "model"]  # movable ones: not the str
    assert words(shell, "%neuron device cpu --move model m") == ["mask", "model"]  # --move takes several
    assert words(shell, "%%neuron parity --vars m") == ["mask", "message", "model"]
    assert words(shell, "%neuron report --full a") == ["all"]  # a flag with no value: the positional is next
    from neuron_lab.backend import coverage

    assert words(shell, "%neuron coverage ") == coverage.bundled()


def test_report_numbers_are_the_kept_reports(shell):
    run(shell, "import torch")
    run(shell, "y = torch.ones(2, device='neuron') * 2")
    kept = [str(n) for n in session_of(shell).history]
    assert len(kept) == 1
    assert words(shell, "%neuron report ") == ["all", *kept]


def test_a_path_option_completes_files(shell, tmp_path):
    (tmp_path / "trace_a.json").write_text("{}")
    (tmp_path / "traces").mkdir()
    assert words(shell, f"%%neuron profile --export {tmp_path}/tr") == [f"{tmp_path}/trace_a.json",
                                                                         f"{tmp_path}/traces/"]


@pytest.mark.filterwarnings("ignore:`Completer.complete` is pending deprecation:PendingDeprecationWarning")
def test_the_shells_legacy_complete_api_offers_the_same(shell):
    assert shell.complete("d", "%neuron d", 9)[1] == ["device", "dashboard"]


def test_unload_removes_the_completer_and_load_adds_it_once(shell):
    run(shell, "%unload_ext neuron_lab")
    assert "device" not in words(shell, "%neuron d")
    run(shell, "%load_ext neuron_lab")
    run(shell, "%load_ext neuron_lab")
    assert words(shell, "%neuron d") == ["device", "dashboard"]


@pytest.mark.parametrize("line, hint", [
    ("%neuron dashbord", "did you mean `dashboard`?"),
    ("%neuron stauts", "did you mean `status`?"),
    ("%neuron mode eagr", "did you mean `eager`?"),
    ("%neuron report --fulll", "unrecognized arguments: --fulll; did you mean `--full`?"),
    ("%neuron device cpu --mvoe x", "did you mean `--move`?"),
])
def test_a_near_miss_is_named(shell, line, hint):
    res, _ = run(shell, line, ok=False)
    assert isinstance(res.error_in_exec, UsageError)
    assert hint in str(res.error_in_exec)


def test_a_cell_magics_near_miss_is_named_and_the_body_does_not_run(shell):
    res, _ = run(shell, "%%neuron compil\nran = True", ok=False)
    assert "did you mean `compile`?" in str(res.error_in_exec)
    assert "ran" not in shell.user_ns


def test_nothing_close_gets_no_guess(shell):
    res, _ = run(shell, "%neuron frobnicate", ok=False)
    assert "invalid choice: 'frobnicate' (choose from 'status'" in str(res.error_in_exec)
    assert "did you mean" not in str(res.error_in_exec)


def test_a_cells_parse_errors_name_the_cell_form_without_renaming_the_shared_parsers():
    """argparse's own error on a cell's first line says ``%%neuron profile``, while the parsers every line shares keep
    their names (renaming them for a parse and back left them renamed for the next line once: a line form's usage
    then read ``usage: %%neuron profile``)."""
    import threading

    p = parser.build()
    names = [p.prog, *(sp.prog for sp, _ in p.subcommands.values())]
    seen: list[str] = []

    def line_form() -> None:  # another thread's line, parsed while the cell's is
        try:
            parser.parse(p, "profile --export t.json", cell=False)
        except UsageError as e:
            seen.append(str(e).splitlines()[-1])

    with pytest.raises(UsageError) as cell:
        thread = threading.Thread(target=line_form)
        thread.start()
        thread.join(timeout=30)
        parser.parse(p, "profile --export", cell=True)
    assert str(cell.value).splitlines() == ["%%neuron profile: argument --export: expected one argument",
                                            "usage: %%neuron profile [--export PATH] [--row-limit N]"]
    assert seen == ["usage: %neuron profile [--export PATH] [--row-limit N]"]
    assert [p.prog, *(sp.prog for sp, _ in p.subcommands.values())] == names
