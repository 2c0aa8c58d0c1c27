"""Answer SQL queries on one embedded ClickHouse store, for a test process that must not open chdb.

chdb allows one store path per process (and one process per path), and a pytest session may
already hold another path in process, so tests that run many queries start this once:

    python tests/services/chdb_sql.py /abs/store   # then one JSON request per stdin line

Each request is ``{"sql": "..."}``; each answer one JSON line: ``{"columns", "types", "rows"}``
(every row, values made JSON-safe) or ``{"error"}``. :class:`SqlSession` drives it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]


def _plain(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return str(value)  # datetimes, decimals, UUIDs


def main(store: str) -> None:
    import clickhouse_connect

    client = clickhouse_connect.get_client(dsn=f"chdb://{store}")
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        try:
            result = client.query(request["sql"])
            answer: dict[str, Any] = {
                "columns": list(result.column_names),
                "types": [t.name for t in result.column_types],
                "rows": [_plain(list(row)) for row in result.result_rows],
            }
        except Exception as exc:  # every ClickHouse or driver error goes back to the test
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        sys.stdout.write(json.dumps(answer) + "\n")
        sys.stdout.flush()


class SqlSession:
    """A running ``chdb_sql.py`` on one store: :meth:`run` sends a query and returns its answer."""

    def __init__(self, store: Path) -> None:
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - lives as long as the runner
        self.process = subprocess.Popen(
            [sys.executable, str(Path(__file__)), str(store)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr, text=True, cwd=ROOT,
        )  # fmt: skip

    def run(self, sql: str) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(json.dumps({"sql": sql}) + "\n")
        self.process.stdin.flush()
        line = self.process.stdout.readline()
        if not line:
            self._stderr.seek(0)
            raise RuntimeError(
                f"the SQL runner exited ({self.process.poll()}):\n{self._stderr.read()[-3000:]}"
            )
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        if self.process.stdout is not None:
            self.process.stdout.close()
        self._stderr.close()


if __name__ == "__main__":
    main(sys.argv[1])
