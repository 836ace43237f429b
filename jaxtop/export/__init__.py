"""Offline tools on recordings: CSV and Perfetto exports (:mod:`.formats`),
driven fast over big files (:mod:`.convert`): samples of a learned line
shape are written from their numbers alone (:mod:`.layouts`), other lines
are decoded with orjson. No Textual, no jax."""

from jaxtop.export.convert import default_jobs, open_recording
from jaxtop.export.formats import CSV_COLUMNS, SPARSE_CSV, write_csv, write_perfetto, write_sparse_csv

__all__ = ["CSV_COLUMNS", "SPARSE_CSV", "default_jobs", "open_recording", "write_csv", "write_perfetto",
           "write_sparse_csv"]
