"""tools/soak.py: a seed range's runs, and each failure with the command that replays it."""
from __future__ import annotations

import gc
import logging

import pytest

from tools import soak


def test_a_range_that_passes_exits_0_and_says_how_many_and_leaves_the_callers_logs_alone(capsys):
    # (tests/sim's conftest froze what collection built, if it ran in this process: a frozen object
    # freed meanwhile lowers the count; a freeze here would raise it by every tracked object)
    level, frozen = logging.getLogger("replog").level, gc.get_freeze_count()
    assert soak.main(["--seeds", "0-3", "--mix", "default", "--jobs", "1"]) == 0
    assert "3 seeds of mix default in" in capsys.readouterr().out
    assert logging.getLogger("replog").level == level and gc.get_freeze_count() <= frozen and gc.isenabled()


def test_a_failing_seed_exits_1_and_names_the_command_that_replays_it(capsys, monkeypatch):
    """Seed 221128 of full+replace stalls with session 50's peers rule turned back
    (tests/sim/test_fixed_bugs.py joiners_keep_their_peers); the jobs are forked, so they run
    with it turned back too."""
    from tests.sim.test_fixed_bugs import joiners_keep_their_peers
    joiners_keep_their_peers(monkeypatch)
    assert soak.main(["--seeds", "221128", "--mix", "full+replace", "--jobs", "1"]) == 1
    out = capsys.readouterr().out
    assert "1 failed" in out and "seed 221128: SimFailure: seed 221128: quiet" in out
    assert "repro: REPLOG_SIM_MIX=full+replace REPLOG_SIM_SEED=221128 .venv/bin/python -m pytest" in out


@pytest.mark.parametrize("argv", [["--seeds", "5-2"], ["--seeds", "x"], ["--seeds", "0-2", "--jobs", "0"],
                                  ["--seeds", "0-2", "--mix", "most"], []])
def test_a_bad_option_is_one_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        soak.main(argv)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "Traceback" not in err
