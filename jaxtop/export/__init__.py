"""Offline tools on recordings: CSV and Perfetto exports (:mod:`.formats`,
the trace's writer in :mod:`.trace`), driven fast over big files
(:mod:`.convert`): samples are decoded into just the fields a format writes,
lean cuts of the wire's types (:mod:`.typed`, msgspec), other lines with
orjson. No Textual, no jax."""

from jaxtop.export.convert import default_jobs, open_recording
from jaxtop.export.formats import CSV_COLUMNS, SPARSE_CSV, write_csv, write_perfetto, write_sparse_csv

__all__ = ["CSV_COLUMNS", "SPARSE_CSV", "default_jobs", "open_recording", "write_csv", "write_perfetto",
           "write_sparse_csv"]
