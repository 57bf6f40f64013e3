"""PySpark and s3fs are optional (``statekit[spark]``, ``statekit[s3]``): without them statekit
imports, runs the local runner and reads local checkpoints, and the parts that need them say
what to install; a PySpark outside the supported range is refused when statekit.spark loads."""

import subprocess
import sys
import textwrap

import pytest

from statekit.errors import MissingDependencyError
from statekit.spark.requires import SUPPORTED, check_pyspark

WITHOUT = textwrap.dedent('''
    import importlib.abc, importlib.metadata, sys
    class Absent(importlib.abc.MetaPathFinder):  # as if neither were installed
        def find_spec(self, name, path, target=None):
            if name.split(".")[0] in ("pyspark", "py4j", "s3fs"):
                raise ImportError(f"No module named {name!r}")
    sys.meta_path.insert(0, Absent())
    real_version = importlib.metadata.version
    def version(name):
        if name in ("pyspark", "s3fs"):
            raise importlib.metadata.PackageNotFoundError(name)
        return real_version(name)
    importlib.metadata.version = version
''')


def run(code: str, tmp_path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", WITHOUT + textwrap.dedent(code)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=300)


def test_statekit_works_without_pyspark_and_s3fs(tmp_path):
    result = run(f'''
        from statekit import StreamExecutionEnvironment
        from statekit.inspection import open_checkpoint
        from statekit.testing.workloads import RunningCount
        env = StreamExecutionEnvironment.get_execution_environment(
            {{"state.checkpoints.dir": {str(tmp_path / "cp")!r},
              "execution.checkpointing.interval": "10 ms",
              "execution.checkpointing.externalized-checkpoint-retention": "RETAIN_ON_CANCELLATION"}})
        env.set_parallelism(2)
        rows = [("a", 1), ("b", 2), ("a", 3)] * 50
        out = list(env.from_collection(rows).key_by(lambda r: r[0]).process(RunningCount())
                   .execute_and_collect())
        assert len(out) == 150, out[:3]
        print("local runner ok")
        import click.testing, statekit.cli
        assert click.testing.CliRunner().invoke(statekit.cli.main, ["--help"]).exit_code == 0
        print("cli ok")
        try:
            import statekit.spark
        except ImportError as exc:
            print("spark:", type(exc).__name__, exc)
    ''', tmp_path)
    assert result.returncode == 0, result.stderr
    assert "local runner ok" in result.stdout and "cli ok" in result.stdout
    assert "spark: MissingDependencyError" in result.stdout
    assert "statekit[spark]" in result.stdout


def test_s3_without_s3fs_names_the_extra(tmp_path):
    result = run('''
        from statekit import FileSystemCheckpointStorage
        from statekit.checkpoint.blobstore.fsspec import FsspecBlobStore
        try:
            FsspecBlobStore("s3://bucket/checkpoints").exists("x")
        except ImportError as exc:
            print(type(exc).__name__, exc)
    ''', tmp_path)
    assert result.returncode == 0, result.stderr
    assert "MissingDependencyError" in result.stdout and "statekit[s3]" in result.stdout


@pytest.mark.parametrize("version", ["4.2.1", "4.4.0", "3.5.3"])
def test_a_pyspark_outside_the_range_is_refused(version):
    with pytest.raises(MissingDependencyError, match=f"found {version}"):
        check_pyspark(version)


def test_the_supported_range_is_the_extra_s(tmp_path):
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    (a, b), (c, d) = SUPPORTED
    assert project["project"]["optional-dependencies"]["spark"] == [f"pyspark>={a}.{b},<{c}.{d}"]
    assert not any(d.startswith(("pyspark", "s3fs")) for d in project["project"]["dependencies"])
    check_pyspark(f"{a}.{b}.0")
    check_pyspark()  # the installed one
