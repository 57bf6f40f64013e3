"""The demos check their flags before any work starts: a backend typo is one clear line naming
the flag and the nearest name (exit code 2), not an error after Spark started."""

import pytest

from statekit.demo import local_demo, spark_demo


@pytest.mark.parametrize("demo", [spark_demo, local_demo])
def test_a_backend_typo_fails_at_once(demo, capsys):
    with pytest.raises(SystemExit) as caught:
        demo.main(["--backend", "hashmp"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "--backend" in err and "did you mean 'hashmap'" in err


@pytest.mark.parametrize("demo", [spark_demo, local_demo])
def test_bad_counts_and_directories_fail_at_once(demo, capsys, tmp_path):
    """A negative or zero count, a count that is no number, a --dir that is a file: one usage
    line each (exit code 2), before any work (no temporary directory is made)."""
    (tmp_path / "file").write_text("not a directory")
    count = "--rows" if demo is spark_demo else "--events"
    for args, words in (([count, "-5"], "at least"), ([count, "x"], "expected an integer"),
                        (["--users", "0"], "at least 1"),
                        (["--dir", str(tmp_path / "file")], "not a directory")):
        with pytest.raises(SystemExit) as caught:
            demo.main(args)
        assert caught.value.code == 2
        assert words in capsys.readouterr().err, args


def test_the_inspect_hint_runs_in_this_shell(monkeypatch, tmp_path):
    """The command the demos print runs whether or not the virtualenv is activated."""
    import os
    import shutil
    import sys

    from statekit.demo import statekit_command

    script = os.path.join(os.path.dirname(sys.executable), "statekit")
    monkeypatch.setenv("PATH", str(tmp_path))  # not activated: the script by its path
    command = statekit_command()
    assert command.endswith(os.path.join("bin", "statekit")) and os.path.exists(command)
    monkeypatch.setenv("PATH", os.path.dirname(script))
    assert statekit_command() == "statekit" and shutil.which("statekit")


@pytest.mark.parametrize("demo", [spark_demo, local_demo])
def test_a_statekit_environment_typo_fails_at_once(demo, capsys, monkeypatch, tmp_path):
    """A misspelt or malformed STATEKIT_* variable: one usage line naming it (exit code 2),
    before Spark starts or a work directory is made."""
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    for name, value, words in (("STATEKIT_STATE_BACKEND_TYP", "rocksdb", "did you mean "
                                "'STATEKIT_STATE_BACKEND_TYPE'"),
                               ("STATEKIT_EXECUTION_CHECKPOINTING_INTERVAL", "-3s",
                                "cannot be negative")):
        monkeypatch.setenv(name, value)
        with pytest.raises(SystemExit) as caught:
            demo.main([])
        monkeypatch.delenv(name)
        assert caught.value.code == 2
        err = capsys.readouterr().err
        assert name in err and words in err
    assert not list(tmp_path.iterdir())


def test_the_spark_demo_resumes_a_dir_only_with_its_own_flags(capsys, tmp_path):
    """A --dir the Spark demo ran in records its input flags; another --files, --rows, --users
    or --adapter there fails at once (its outputs and checkpoint would not match the input)."""
    (tmp_path / "demo.json").write_text(
        '{"adapter": "foreach_batch", "files": 6, "rows": 20000, "users": 2000}')
    with pytest.raises(SystemExit) as caught:
        spark_demo.main(["--dir", str(tmp_path), "--files", "8"])
    assert caught.value.code == 2
    assert "--files 6 (now 8)" in capsys.readouterr().err
