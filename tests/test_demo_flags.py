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
