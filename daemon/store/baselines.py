"""The baseline store: per-window points of each service's metrics, kept in one
SQLite file (WAL, synchronous=FULL, so a kill -9 of the writer loses nothing
committed), keyed by service, metric, environment and deploy id. It summarises
and compares them; time always comes in as an argument. The file's layout
version is its `PRAGMA user_version`; opening an older file migrates it. A file
found corrupt when the daemon opens it (not SQLite, failing `PRAGMA quick_check`,
or not holding the layout) is moved aside, never deleted, and a fresh store
starts; a store that is merely locked is not corrupt."""
from __future__ import annotations

import builtins
import logging
import math
import sqlite3
import threading
from pathlib import Path
from typing import Iterable, NamedTuple

import numpy as np

from slotune.host.safe_files import set_aside

log = logging.getLogger(__name__)
SCHEMA_VERSION = 1
# MIGRATIONS[v] brings a file at version v - 1 to version v (a file from before
# versions were kept reads 0 and already has version 1's layout).
MIGRATIONS = {1: """
CREATE TABLE IF NOT EXISTS series (
    id INTEGER PRIMARY KEY,
    service TEXT NOT NULL, metric TEXT NOT NULL, environment TEXT NOT NULL, deploy_id TEXT NOT NULL,
    UNIQUE (service, metric, environment, deploy_id));
CREATE TABLE IF NOT EXISTS points (
    series_id INTEGER NOT NULL REFERENCES series(id), t REAL NOT NULL, value REAL NOT NULL,
    PRIMARY KEY (series_id, t)) WITHOUT ROWID;
"""}
# what every version's layout reads: a file whose tables lack these columns is not a baseline store
LAYOUT = {"series": "SELECT id, service, metric, environment, deploy_id FROM series LIMIT 0",
          "points": "SELECT series_id, t, value FROM points LIMIT 0"}
# SQLite's answers that say the file's contents are wrong (not SQLite, damaged, another layout),
# unlike busy, locked, full, read-only or cannot-open, which say nothing about the file
CORRUPT_CODES = (sqlite3.SQLITE_ERROR, sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB)


class CorruptStore(sqlite3.DatabaseError):
    """PRAGMA quick_check found the file damaged."""


def is_corrupt(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)
    return isinstance(exc, CorruptStore) or (code is not None and code & 0xff in CORRUPT_CODES)


class UnknownBaseline(LookupError):
    """A service, metric or deploy the store holds no points for; the message lists the known ones."""


class Summary(NamedTuple):
    count: int  # type: ignore[assignment]  # a field named count, over tuple.count()
    mean: float
    std: float  # sample standard deviation (0 for a single point)
    p50: float
    p90: float
    p99: float
    first_t: float
    last_t: float


class SeriesInfo(NamedTuple):
    service: str
    metric: str
    environment: str
    deploy_id: str
    count: int  # type: ignore[assignment]  # a field named count, over tuple.count()
    first_t: float
    last_t: float


class DeployInfo(NamedTuple):
    deploy_id: str
    first_t: float
    last_t: float
    count: int  # type: ignore[assignment]  # points over all metrics of the deploy (over tuple.count())


class MetricDiff(NamedTuple):
    metric: str
    a: Summary | None
    b: Summary | None
    mean_change: float  # b.mean / a.mean - 1 (+0.08 = 8 % higher in b); nan when a side is missing
    p99_change: float
    ks_statistic: float  # two-sample Kolmogorov-Smirnov over the points of a and b
    ks_pvalue: float


def _where(service, metric, environment, deploy_id, since, until) -> tuple[str, tuple]:
    """SQL condition and parameters selecting the points of a query."""
    clauses, params = ["s.service = ?", "s.environment = ?"], [service, environment]
    for column, value in (("s.metric", metric), ("s.deploy_id", deploy_id)):
        if value is not None:
            clauses.append(f"{column} = ?")
            params.append(value)
    if since is not None:
        clauses.append("p.t >= ?")
        params.append(float(since))
    if until is not None:
        clauses.append("p.t <= ?")
        params.append(float(until))
    return " AND ".join(clauses), tuple(params)


def _relative_change(a: float, b: float) -> float:
    if a == 0:
        return 0.0 if b == 0 else math.copysign(math.inf, b)
    return b / a - 1.0


def summarize(times: np.ndarray, values: np.ndarray) -> Summary | None:
    if len(values) == 0:
        return None
    p50, p90, p99 = np.quantile(values, [0.5, 0.9, 0.99])
    std = float(np.std(values, ddof=1)) if len(values) > 1 else 0.0
    return Summary(len(values), float(np.mean(values)), std, float(p50), float(p90), float(p99),
                   float(times.min()), float(times.max()))


def _check_row(row) -> tuple:
    try:
        service, metric, value, t, environment, deploy_id = row
    except (TypeError, ValueError):
        raise ValueError(f"baseline row {row!r}: expected (service, metric, value, t, environment, deploy_id)") from None
    for name, text in (("service", service), ("metric", metric), ("environment", environment),
                       ("deploy_id", deploy_id)):
        if not isinstance(text, str) or not text:
            raise ValueError(f"baseline row {row!r}: {name} must be a non-empty string")
    try:
        value, t = float(value), float(t)
    except (TypeError, ValueError):
        value = t = math.nan
    if not (math.isfinite(value) and math.isfinite(t)):
        raise ValueError(f"baseline row {row!r}: value and t must be finite numbers "
                         "(skip windows that had no data instead of recording nan)")
    return service, metric, environment, deploy_id, t, value


def _check(db: sqlite3.Connection) -> None:
    """CorruptStore, or SQLite's own error, when the file is damaged or holds another layout; reads only."""
    problems = " ".join(str(row[0]) for row in db.execute("PRAGMA quick_check").fetchall())
    if problems != "ok":
        shown = " ".join(problems.split())      # its lines run together, cut to a log line's length
        raise CorruptStore(f"PRAGMA quick_check: {shown[:200]}{'...' if len(shown) > 200 else ''}")
    names = {name for (name,) in db.execute("SELECT name FROM sqlite_master")}
    for table, query in LAYOUT.items():
        if table in names:
            db.execute(query)


def _migrate(db: sqlite3.Connection) -> None:
    version = db.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise sqlite3.DatabaseError(f"it was written by a newer slotune (layout version {version}, this one "
                                    f"knows up to {SCHEMA_VERSION}); upgrade slotune or use another file")
    for v in range(version + 1, SCHEMA_VERSION + 1):
        db.executescript(f"BEGIN IMMEDIATE; {MIGRATIONS[v]} PRAGMA user_version = {v}; COMMIT;")


class BaselineStore:
    """One SQLite file of baseline points. Safe to share between threads; other
    processes (e.g. `slotune baseline`) may read it while the daemon writes."""

    def __init__(self, path: str | Path, create: bool = True, busy_timeout_s: float = 10.0):
        """create: make the file if missing, migrate it, and move a corrupt one aside for a fresh
        store; else open an existing store as it is (to read it)."""
        self.path, self.busy_timeout_s = Path(path), busy_timeout_s
        if not create and not self.path.is_file():
            raise FileNotFoundError(f"baseline store {self.path} does not exist "
                                    "(the daemon creates it on its first window; check --store or the config)")
        try:
            if create:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            self._db = self._open_fresh_if_corrupt() if create else self._open(create=False)
        except (OSError, sqlite3.Error) as exc:
            raise OSError(f"cannot open baseline store {self.path}: {exc} "
                          "(the folder must exist or be creatable and be writable; "
                          "set a writable path with --store or the config's baseline store path)") from exc
        self._lock = threading.Lock()

    def _open_fresh_if_corrupt(self) -> sqlite3.Connection:
        try:
            return self._open(create=True)
        except sqlite3.DatabaseError as exc:
            if not is_corrupt(exc):
                raise
            aside = set_aside(self.path, companions=("-wal", "-shm", "-journal"))
            log.error("baseline store %s is corrupt (%s): moved aside to %s, a fresh store starts in its place",
                      self.path, exc, aside)
            return self._open(create=True)

    def _open(self, create: bool) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None, timeout=self.busy_timeout_s)
        try:
            if create:              # checked before anything is written to it
                _check(db)
                _migrate(db)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=FULL")
            if not create and not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'points'").fetchone():
                raise sqlite3.DatabaseError("it holds no baseline points table")
        except BaseException:
            db.close()
            raise
        return db

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _series_id(self, service, metric, environment, deploy_id) -> int:
        key = (service, metric, environment, deploy_id)
        row = self._db.execute("SELECT id FROM series WHERE service=? AND metric=? AND environment=? "
                               "AND deploy_id=?", key).fetchone()
        if row:
            return row[0]
        made = self._db.execute("INSERT INTO series (service, metric, environment, deploy_id) "
                                "VALUES (?, ?, ?, ?)", key).lastrowid
        assert made is not None          # an INSERT's row always has one
        return made

    def record(self, service: str, metric: str, value: float, t: float, environment: str,
               deploy_id: str) -> None:
        self.record_many([(service, metric, value, t, environment, deploy_id)])

    def record_many(self, rows: Iterable[tuple]) -> int:
        """Store (service, metric, value, t, environment, deploy_id) rows in one
        transaction; a second point for the same series and t replaces the first."""
        checked = [_check_row(row) for row in rows]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                ids: dict[tuple, int] = {}
                points = []
                for service, metric, environment, deploy_id, t, value in checked:
                    key = (service, metric, environment, deploy_id)
                    if key not in ids:
                        ids[key] = self._series_id(*key)
                    points.append((ids[key], t, value))
                self._db.executemany("INSERT OR REPLACE INTO points (series_id, t, value) VALUES (?, ?, ?)",
                                     points)
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:   # a failed COMMIT (disk full) may have ended it
                    self._db.execute("ROLLBACK")
                raise
        return len(checked)

    def _points(self, where: tuple[str, tuple]) -> tuple[np.ndarray, np.ndarray]:
        condition, params = where
        with self._lock:
            rows = self._db.execute(f"SELECT p.t, p.value FROM points p JOIN series s ON s.id = p.series_id "
                                    f"WHERE {condition} ORDER BY p.t", params).fetchall()
        arr = np.array(rows, dtype=float).reshape(-1, 2)
        return arr[:, 0], arr[:, 1]

    def values(self, service: str, metric: str, environment: str, deploy_id: str | None = None,
               since: float | None = None, until: float | None = None) -> np.ndarray:
        """The points' values in time order; deploy_id None takes every deploy."""
        return self._points(_where(service, metric, environment, deploy_id, since, until))[1]

    def summary(self, service: str, metric: str, environment: str, deploy_id: str | None = None,
                since: float | None = None, until: float | None = None) -> Summary | None:
        """Count, mean, std, p50/p90/p99 and time span of the points; None when there are none."""
        return summarize(*self._points(_where(service, metric, environment, deploy_id, since, until)))

    def deploys(self, service: str, environment: str) -> list[DeployInfo]:
        with self._lock:
            rows = self._db.execute(
                "SELECT s.deploy_id, MIN(p.t), MAX(p.t), COUNT(*) FROM points p JOIN series s "
                "ON s.id = p.series_id WHERE s.service = ? AND s.environment = ? GROUP BY s.deploy_id "
                "ORDER BY MIN(p.t)", (service, environment)).fetchall()
        return [DeployInfo(*row) for row in rows]

    def list(self) -> list[SeriesInfo]:
        with self._lock:
            rows = self._db.execute(
                "SELECT s.service, s.metric, s.environment, s.deploy_id, COUNT(*), MIN(p.t), MAX(p.t) "
                "FROM series s JOIN points p ON s.id = p.series_id GROUP BY s.id "
                "ORDER BY s.service, s.environment, MIN(p.t), s.metric").fetchall()
        return [SeriesInfo(*row) for row in rows]

    def require(self, service: str, environment: str, metric: str | None = None,
                deploy_id: str | None = None) -> None:
        """Raise UnknownBaseline, listing what is known, unless the store holds points
        for this service in this environment (and this metric, and this deploy)."""
        series = [s for s in self.list() if s.service == service and s.environment == environment]
        if not series:
            pairs = sorted({(s.service, s.environment) for s in self.list()})
            listed = ", ".join(f"{s} ({e})" for s, e in pairs) or "none: the store is empty"
            raise UnknownBaseline(f"no baseline for service {service!r} in environment {environment!r} "
                                  f"in {self.path}; known services (environment): {listed}")
        for what, value, known in (("metric", metric, sorted({s.metric for s in series})),
                                   ("deploy", deploy_id, [d.deploy_id for d in self.deploys(service, environment)])):
            if value is not None and value not in known:
                raise UnknownBaseline(f"no {what} {value!r} for service {service!r} in environment "
                                      f"{environment!r} in {self.path}; known {what}s: {', '.join(known)}")

    def diff(self, service: str, environment: str, deploy_a: str, deploy_b: str,
             metrics: Iterable[str] | None = None) -> builtins.list[MetricDiff]:   # list: the method above
        """Per metric: both summaries, the relative change of mean and p99 from a to b,
        and the two-sample KS test of their points. Metrics default to those of either deploy."""
        from scipy import stats  # 0.9 s to import: only when a diff is asked for

        for deploy in (deploy_a, deploy_b):
            self.require(service, environment, deploy_id=deploy)
        if metrics is None:
            metrics = sorted({s.metric for s in self.list() if s.service == service
                              and s.environment == environment and s.deploy_id in (deploy_a, deploy_b)})
        out = []
        for metric in metrics:
            ta, va = self._points(_where(service, metric, environment, deploy_a, None, None))
            tb, vb = self._points(_where(service, metric, environment, deploy_b, None, None))
            sa, sb = summarize(ta, va), summarize(tb, vb)
            if sa is None or sb is None:
                out.append(MetricDiff(metric, sa, sb, math.nan, math.nan, math.nan, math.nan))
                continue
            ks = stats.ks_2samp(va, vb)
            out.append(MetricDiff(metric, sa, sb, _relative_change(sa.mean, sb.mean),
                                  _relative_change(sa.p99, sb.p99), float(ks.statistic), float(ks.pvalue)))
        return out

    def prune(self, older_than: float) -> int:
        """Delete points with t < older_than (and series left empty); returns the points deleted."""
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                deleted = 0
                for (series_id,) in self._db.execute("SELECT id FROM series").fetchall():
                    deleted += self._db.execute("DELETE FROM points WHERE series_id = ? AND t < ?",
                                                (series_id, float(older_than))).rowcount
                self._db.execute("DELETE FROM series WHERE NOT EXISTS "
                                 "(SELECT 1 FROM points WHERE series_id = series.id)")
                self._db.execute("COMMIT")
            except BaseException:
                if self._db.in_transaction:   # a failed COMMIT (disk full) may have ended it
                    self._db.execute("ROLLBACK")
                raise
        return deleted
