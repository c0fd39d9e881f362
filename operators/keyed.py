"""Records that carry their key: Row(key, value), keyed in Java by the first field.

PyFlink's ``DataStream.key_by`` runs every record through a Python operator of its own that builds
exactly this Row, then keys the stream in Java by field 0. Operators that emit the Row themselves
let the job key their output with no such operator (jobs/delivery_job.py, keyed_by_first_field):
one Python call, one pickling and, where the extra operator could not chain, one task and one
exchange fewer per record. The keyed function receives the value, as after ``key_by``.
"""

from __future__ import annotations

from typing import Any

from pyflink.common import Row
from pyflink.common.typeinfo import Types

KEYED_RECORD = Types.ROW([Types.STRING(), Types.PICKLED_BYTE_ARRAY()])


def keyed(key: str, value: Any) -> Row:
    return Row(key, value)
