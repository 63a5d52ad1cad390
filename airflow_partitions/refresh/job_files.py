"""The files a spark-submit refresh job exchanges with whoever submits it: its arguments, the plan it
reads, the result it writes.

The job (`spark_jobs/refresh_partitions.py`) and the Spark operators' stage runner both go through here,
so each file has one writer and one reader: the submitter writes the plan and reads the stage result, the
job reads the plan (and work items) and writes the result.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_partitions.exceptions import RefreshError
from airflow_partitions.objectstore.settings import S3Settings, as_settings
from airflow_partitions.refresh.plan import PartitionWorkItem, RefreshPlan, StageResult

PLAN_FILE = "plan.json"
STAGE_RESULT_FILE = "stage.json"
# `<staging root>/.job-*/`: removed after the task; `refresh.leftovers` sweeps those a killed task left
JOB_FILES_PREFIX = ".job-"
# The S3 settings of an `s3://` accelerator_dir, as compact JSON, in a submitted job's environment: the
# job and its executors know no Airflow connection. The environment, not the command line (which `ps`
# shows). On YARN / Kubernetes the provider turns it into a `--conf` entry; "SECRET" in the name and a
# value without whitespace make its masker hide the whole value in the logged command.
S3_SETTINGS_ENV = "AP_ACCELERATION_S3_SECRET_SETTINGS"


def build_stage_job_args(
    *, spec_path: str, dataset: str, plan_file: str, location: str, output_file: str
) -> list[str]:
    """Arguments of `refresh_partitions.py` for one stage (a pure function: tested as is)."""
    return [
        "stage",
        "--spec",
        spec_path,
        "--dataset",
        dataset,
        "--plan",
        plan_file,
        "--location",
        location,
        "--output",
        output_file,
    ]


@dataclass(frozen=True)
class StageJobFiles:
    """The plan and result files of one submitted stage job, in a private directory."""

    directory: Path

    @property
    def plan_file(self) -> Path:
        return self.directory / PLAN_FILE

    @property
    def result_file(self) -> Path:
        return self.directory / STAGE_RESULT_FILE

    def job_args(self, *, spec_path: str, dataset: str, location: str) -> list[str]:
        """The job's arguments: stage into `location`, reading and writing this directory's files."""
        return build_stage_job_args(
            spec_path=spec_path,
            dataset=dataset,
            plan_file=str(self.plan_file),
            location=location,
            output_file=str(self.result_file),
        )

    def write_plan(self, plan: RefreshPlan) -> None:
        self.plan_file.write_text(json.dumps(plan.to_json()), encoding="utf-8")

    def read_stage_result(self) -> StageResult:
        """The stage result the job wrote; `RefreshError` if it wrote none (it failed: see its log)."""
        if not self.result_file.exists():
            raise RefreshError(
                f"the Spark job finished without writing its stage result {self.result_file}; see its log "
                "above"
            )
        return StageResult.from_json(_read_json(self.result_file))


@contextmanager
def stage_job_files(root: str | os.PathLike[str]) -> Iterator[StageJobFiles]:
    """A fresh `StageJobFiles` under `root` (a directory every Spark driver sees), removed afterwards."""
    with tempfile.TemporaryDirectory(dir=root, prefix=JOB_FILES_PREFIX) as directory:
        yield StageJobFiles(Path(directory))


def s3_settings_environment(settings: Any) -> dict[str, str]:
    """The environment entry that hands `settings` (an `S3Settings` or its dict form) to a submitted job."""
    from dataclasses import asdict

    return {S3_SETTINGS_ENV: json.dumps(asdict(as_settings(settings)), separators=(",", ":"))}


def s3_settings_from_environment() -> Any:
    """The `S3Settings` a submitter handed over in the environment, or None."""

    text = os.environ.get(S3_SETTINGS_ENV, "").strip()
    if not text:
        return None
    try:
        values = json.loads(text)
    except ValueError:
        raise RefreshError(
            f"{S3_SETTINGS_ENV} is not JSON; it is set by the refresh operator for a spark-submit job, "
            "unset it when running the job by hand (boto3's default credential chain is used then)"
        ) from None
    return S3Settings.from_mapping(values)


def read_plan(path: str | os.PathLike[str]) -> RefreshPlan:
    return RefreshPlan.from_json(_read_json(path))


def read_work_items(path: str | os.PathLike[str]) -> list[PartitionWorkItem]:
    return [PartitionWorkItem.from_json(item) for item in _read_json(path)]


def read_stage_reference(value: str) -> StageResult | str:
    """`--stage` of a finalize job: a `StageResult` JSON file, else the stage location itself."""
    path = Path(value)
    return StageResult.from_json(_read_json(path)) if path.is_file() else value


def write_job_output(output: Mapping[str, Any], path: str | os.PathLike[str] | None) -> None:
    """The job's result JSON, to `path` (what `StageJobFiles.read_stage_result` reads) or to stdout."""
    text = json.dumps(output, separators=(",", ":"))
    if path:
        Path(path).write_text(text, encoding="utf-8")
    else:
        print(text)


def _read_json(path: str | os.PathLike[str]) -> Any:
    return json.loads(Path(path).read_text(encoding="utf-8"))
