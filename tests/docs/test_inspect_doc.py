"""docs/inspect.md's Python blocks run as written, one after another in one fresh interpreter
(later blocks use earlier ones' names); their ``# prints: ...`` comments must appear in the
output, and the run leaves nothing behind."""

from tests.docs.test_pages import python_blocks, run_examples


def test_inspect_page_examples_run(tmp_path):
    code = "\n".join(python_blocks("inspect.md"))
    assert "open_checkpoint(" in code and "convert_savepoint(" in code and "verify(" in code
    run_examples(code, tmp_path)
