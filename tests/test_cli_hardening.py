"""Hostile input to the command line: a closed output pipe, YAML alias bombs and oversized specs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from airflow_partitions.exceptions import SpecValidationError
from airflow_partitions.spec import parse_spec
from airflow_partitions.spec.yaml_lines import MAX_EXPANDED_NODES, MAX_SPEC_BYTES, read_yaml

REPO_ROOT = Path(__file__).resolve().parent.parent

DATASET = """\
  - name: d{i}
    from: file:data/
    params: {{file_format: parquet}}
    acceleration:
      partition_by:
        - bucket(4, id)
"""


def many_datasets_spec(tmp_path: Path, count: int) -> Path:
    path = tmp_path / "datasets.yaml"
    path.write_text(
        "accelerator_dir: accel\ndatasets:\n" + "".join(DATASET.format(i=i) for i in range(count))
    )
    return path


def test_status_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    """`status | head -1`: the reader closes the pipe after one line; no traceback may reach the user."""
    spec = many_datasets_spec(tmp_path, 400)
    process = subprocess.Popen(
        [sys.executable, "-m", "airflow_partitions.cli.main", "status", str(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    first = process.stdout.readline()
    process.stdout.close()  # what `head -1` does after its line
    stderr = process.stderr.read().decode()
    code = process.wait(timeout=120)
    assert first, "status printed nothing before the pipe closed"
    assert "Traceback" not in stderr, stderr
    assert "BrokenPipeError" not in stderr, stderr
    assert code == 141


def alias_bomb(levels: int, inside_params: bool) -> str:
    anchors = ['      l0: &l0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    for level in range(1, levels):
        refs = ",".join([f"*l{level - 1}"] * 9)
        anchors.append(f"      l{level}: &l{level} [{refs}]")
    block = "\n".join(anchors)
    if inside_params:
        return (
            "accelerator_dir: accel\ndatasets:\n  - name: t\n    from: file:data/\n    params:\n"
            f"      file_format: parquet\n{block}\n"
            "    acceleration:\n      partition_by:\n        - bucket(4, id)\n"
        )
    return "bomb:\n" + block.replace("      ", "  ") + "\naccelerator_dir: accel\ndatasets: []\n"


# The timeouts only stop a hang: before the bound, these inputs ran for minutes and gigabytes.
@pytest.mark.timeout(60)
@pytest.mark.parametrize("inside_params", [True, False], ids=["in-params", "top-level"])
def test_yaml_alias_bomb_is_refused(inside_params: bool) -> None:
    """9 levels of 9 aliases stand for 387 million values: refused before anything expands them."""
    with pytest.raises(SpecValidationError) as raised:
        parse_spec(alias_bomb(9, inside_params), base_dir=Path("/tmp"))
    assert "YAML aliases" in str(raised.value)
    assert f"{MAX_EXPANDED_NODES:,}" in str(raised.value)


def test_aliases_below_the_bound_still_work() -> None:
    """Anchors are a legitimate way to share settings: a small expansion parses as before."""
    text = (
        "defaults: &defaults {file_format: parquet}\n"
        "accelerator_dir: accel\ndatasets:\n"
        "  - name: a\n    from: file:data/\n    params: *defaults\n"
        "    acceleration:\n      partition_by:\n        - bucket(4, id)\n"
    )
    document = read_yaml(alias_bomb(4, True))  # 9**4 = 6,561 values: fine
    assert document.data["datasets"][0]["params"]["l3"][0][0][0] == ["lol"] * 9
    with pytest.raises(SpecValidationError) as raised:
        parse_spec(text, base_dir=Path("/tmp"))
    # Only the unknown top-level key is reported; the alias itself resolved.
    assert "defaults" in str(raised.value)
    assert "YAML aliases" not in str(raised.value)


@pytest.mark.timeout(60)
def test_oversized_spec_is_refused_before_parsing() -> None:
    text = "accelerator_dir: accel\ndatasets: []\n# " + "x" * MAX_SPEC_BYTES + "\n"
    with pytest.raises(SpecValidationError) as raised:
        parse_spec(text, base_dir=Path("/tmp"))
    message = str(raised.value)
    assert f"{MAX_SPEC_BYTES:,}-byte limit" in message
    assert "split its datasets" in message
