"""docs/inspect.md's Python blocks run as written, one after another in one fresh interpreter
(later blocks use earlier ones' names); their ``# prints: ...`` comments must appear in the
output."""

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)


def test_inspect_page_examples_run(tmp_path):
    text = (ROOT / "docs" / "inspect.md").read_text()
    code = "\n".join(body for lang, body in FENCE.findall(text) if lang == "python")
    assert "open_checkpoint(" in code and "convert_savepoint(" in code and "verify(" in code
    env = {**os.environ, "TMPDIR": str(tmp_path), "PYTHONPATH": str(ROOT / "src")}
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for expected in re.findall(r"# prints: (.+)$", code, re.M):
        assert expected.strip() in done.stdout, (expected, done.stdout)
