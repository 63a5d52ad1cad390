"""Writes routed by partition key: append, upsert on key columns and delete by filter, each one atomic
catalog commit.

`routing` and `merge` are the row-level primitives (also used by the refresh modes that apply changes);
`commit` plans, writes and publishes a write; `write_through` sends the rows to a Postgres source first.
"""

from __future__ import annotations
