"""Every Python snippet in README.md runs as written (in a fresh process, outside the
checkout), so what a newcomer copies works."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
SNIPPETS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_readme_has_snippets():
    assert len(SNIPPETS) >= 5


@pytest.mark.parametrize("n", range(len(SNIPPETS)), ids=lambda n: f"snippet{n + 1}")
def test_readme_snippet_runs_as_written(n, tmp_path):
    path = tmp_path / f"snippet{n + 1}.py"
    path.write_text(SNIPPETS[n])
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"README snippet {n + 1} failed:\n{SNIPPETS[n]}\n{done.stderr[-3000:]}"
