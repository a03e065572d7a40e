"""RolloutStore: every rollout of a run, durable, in `RUN/rollouts.sqlite`.

The trainer calls `write_step` once per step with the step's rollouts and metrics; the rows and
the step's marker go in one transaction, so after a crash (even SIGKILL) the store holds steps
1..k complete and nothing of step k+1. WAL journaling with synchronous=NORMAL keeps a commit
cheap (no fsync per transaction) while staying consistent after an application crash; only a
power loss can drop the last few committed steps, which resuming from a checkpoint rewrites anyway
(`rollback_after`).

Readers (`grpokit inspect`, the HTML report) open the file read-only and can do so while the
trainer is writing. On read-only storage (a finished run on a read-only mount, a folder without write
permission) or a full disk, SQLite cannot create the `-shm` file that a read-only connection to a WAL store
needs (a live trainer would have made it); the reader then opens the file as immutable, or, when the `-wal`
file still holds steps that were never copied into the main file (a trainer killed by SIGKILL), a private copy
of both in a temporary folder, so no committed step is left out.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from grpokit.store import images, prompt_history, teacher_values, token_values, typed_rows
from grpokit.store.errors import StoreError
from grpokit.store.query import reading_only, run_query
from grpokit.store.read_only import read_only_uri
from grpokit.store.record import RolloutRecord, finite_or_none
from grpokit.store.sql_schema import SCHEMA_VERSION, schema_sql

STORE_FILENAME = "rollouts.sqlite"
_FILE_SUFFIXES = (".sqlite", ".sqlite3", ".db")

_ROLLOUT_COLUMNS = (
    "run_id",
    "step",
    "prompt_index",
    "completion_index",
    "prompt",
    "completion",
    "prompt_tokens",
    "completion_tokens",
    "finish_reason",
    "rewards",
    "reward",
    "advantage",
    "policy_version",
    "error",
    "extra",
    "conversation",
    "token_versions",
    "images",
)
# Columns added after the first stores were written: ALTERed into a store opened for writing, left out of reads
# of a store without them.
_ADDED_COLUMNS = ("extra", "conversation", "token_versions", "images")
_INSERT_ROLLOUT = (
    f"INSERT INTO rollouts ({', '.join(_ROLLOUT_COLUMNS)}) VALUES ({', '.join('?' for _ in _ROLLOUT_COLUMNS)})"
)


_EVAL_PROMPT_COLUMNS = ("step", "dataset", "prompt_index", "prompt", "correct", "samples", "mean_reward", "images")
_INSERT_EVAL_PROMPT = f"INSERT INTO eval_prompts ({', '.join(_EVAL_PROMPT_COLUMNS)}) VALUES ({', '.join('?' * 8)})"


def _eval_prompt_row(step: int, dataset: str, p: dict) -> tuple:
    hashes = p.get("images")
    row = (p["prompt_index"], p["prompt"], p["correct"], p["samples"], finite_or_none(p["mean_reward"]))
    return (step, dataset, *row, json.dumps(list(hashes)) if hashes else None)


class DuplicateStepError(StoreError):
    """A step (or a step's eval of a dataset) is written a second time."""


def resolve_store_path(path: str | Path) -> Path:
    """The SQLite file for `path`: a file ending in .sqlite/.sqlite3/.db, else a run folder."""
    path = Path(path)
    if path.suffix in _FILE_SUFFIXES and not path.is_dir():
        return path
    return path / STORE_FILENAME


def _nan_if_null(value: float | None) -> float:
    return math.nan if value is None else value


class RolloutStore:
    """Every rollout, step metric and eval result of one run, in SQLite.

    `path` is the run folder (the store is `path/rollouts.sqlite`) or the SQLite file itself.
    `run_id` labels the rows this instance writes; by default the id recorded when the store was
    created, which is the run folder's name. `readonly=True` opens an existing store for reading.
    `log_multimodal` and `max_image_bytes`: which of the prompts' images go to the folder `images/` beside the
    file (grpokit/store/images.py).
    """

    def __init__(
        self,
        path: str | Path,
        run_id: str | None = None,
        readonly: bool = False,
        log_multimodal: bool = True,
        max_image_bytes: int | None = None,
    ):
        self.path = resolve_store_path(path)
        self.readonly = readonly
        self.image_files = images.ImageFiles(self.path.parent / images.FOLDER)
        self._images = images.ImageWriter(self.image_files, log_multimodal, max_image_bytes)
        self._query_conn: sqlite3.Connection | None = None
        self._read_uri: str | None = None  # how a read-only connection opens the file (see _read_only_uri)
        self._copy: str | None = None  # the temporary folder of a private copy, removed by close()
        self._problems = typed_rows.Problems()  # values of the wrong type the readers replaced
        self._conn = self._connect_readonly() if readonly else self._connect_writable(run_id)
        try:
            self._check_schema_version()
        except StoreError:
            self._conn.close()
            raise
        self.run_id = run_id or self._meta("run_id")

    # ----------------------------------------------------------------- opening

    def _connect_writable(self, run_id: str | None) -> sqlite3.Connection:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # Autocommit mode: transactions are opened explicitly, one per write call.
        self._conn = sqlite3.connect(self.path, isolation_level=None)
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
            self._conn.execute("PRAGMA synchronous=NORMAL")
            self._conn.execute("PRAGMA busy_timeout=10000")
            self._conn.executescript(schema_sql(sqlite3.sqlite_version_info))
            present = self._table_columns()
            for column in _ADDED_COLUMNS:  # a store written before the column existed
                if column not in present:
                    self._conn.execute(f"ALTER TABLE rollouts ADD COLUMN {column} TEXT")
            teacher = {row[1] for row in self._conn.execute(f"PRAGMA table_info({teacher_values.TABLE})")}
            if "images" not in self._table_columns("eval_prompts"):
                self._conn.execute("ALTER TABLE eval_prompts ADD COLUMN images TEXT")  # written before it existed
            images.add_eval_column(self._conn)
            if teacher_values.KEY_COLUMN not in teacher:  # a teacher table written before the column existed
                self._conn.execute(f"ALTER TABLE {teacher_values.TABLE} ADD COLUMN {teacher_values.KEY_COLUMN} TEXT")
            self._init_meta(run_id or self.path.resolve().parent.name)
            prompt_history.create(self._conn, strict=sqlite3.sqlite_version_info >= (3, 37, 0))
        except sqlite3.DatabaseError as err:
            self._conn.close()
            raise StoreError(f"{self.path} is not a grpokit rollout store ({err})") from err
        return self._conn

    def _connect_readonly(self) -> sqlite3.Connection:
        if not self.path.is_file():
            raise StoreError(
                f"no rollout store at {self.path}: not a run folder, or a run that has not written "
                "a step yet (its metrics.jsonl, if any, still gives `grpokit report`)"
            )
        if self._read_uri is None:
            self._read_uri, self._copy = read_only_uri(self.path)
        conn = sqlite3.connect(self._read_uri, uri=True, isolation_level=None)
        # A reader waits for the trainer's commit instead of failing with "database is locked".
        conn.execute("PRAGMA busy_timeout=10000")
        return conn

    def _table_columns(self, table: str = "rollouts") -> list[str]:
        return [row[1] for row in self._conn.execute(f"PRAGMA table_info({table})")]

    def _init_meta(self, run_id: str) -> None:
        with self._transaction():
            self._conn.executemany(
                "INSERT OR IGNORE INTO meta (key, value) VALUES (?, ?)",
                [
                    ("schema_version", str(SCHEMA_VERSION)),
                    ("run_id", run_id),
                    ("created", time.strftime("%Y-%m-%dT%H:%M:%S%z")),
                ],
            )

    def _meta(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row is not None and isinstance(row[0], str) else None

    def _check_schema_version(self) -> None:
        try:
            version = self._meta("schema_version")
        except sqlite3.DatabaseError as err:
            raise StoreError(f"{self.path} is not a grpokit rollout store ({err})") from err
        if version != str(SCHEMA_VERSION):
            raise StoreError(
                f"{self.path} has store schema version {version}; this grpokit reads version {SCHEMA_VERSION}"
            )

    @contextmanager
    def _transaction(self) -> Iterator[None]:
        if self.readonly:
            raise StoreError(f"{self.path} is open read-only")
        # IMMEDIATE takes the write lock up front, so a concurrent writer waits (busy_timeout)
        # at BEGIN instead of failing midway through the step.
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._conn.execute("COMMIT")
        except BaseException:
            if self._conn.in_transaction:  # SQLite rolls back by itself on some errors (a full disk)
                self._conn.execute("ROLLBACK")
            raise

    # ----------------------------------------------------------------- writing

    def write_step(self, step: int, rollouts: list[RolloutRecord], metrics: dict[str, float]) -> None:
        """Write one step's rollouts and metrics in one transaction; a written step raises.

        Non-finite metric values are stored as null (a record's numbers are finite or None already).
        """
        rows = [self._rollout_row(step, i, r) for i, r in enumerate(rollouts)]
        metric_rows = [(step, name, finite_or_none(value)) for name, value in metrics.items()]
        try:
            image_rows = self._images.rows(self._conn, step, rollouts)  # their files written first, durably
        except OSError as err:
            raise StoreError(f"cannot write the images of step {step} to {self.image_files.folder}: {err}") from None
        try:
            with self._transaction():
                self._conn.executemany(images.INSERT, image_rows)
                self._conn.execute("INSERT INTO steps (step, written_at) VALUES (?, ?)", (step, time.time()))
                self._conn.executemany(_INSERT_ROLLOUT, rows)
                prompt_history.update(self._conn, step)  # each prompt's history, with its rollouts
                self._conn.executemany(token_values.INSERT, token_values.rows(step, rollouts))
                self._conn.executemany(teacher_values.INSERT, teacher_values.rows(step, rollouts))
                self._conn.executemany("INSERT INTO step_metrics (step, name, value) VALUES (?, ?, ?)", metric_rows)
        except sqlite3.IntegrityError as err:
            if self._has_step(step):
                raise DuplicateStepError(
                    f"step {step} is already in {self.path}; call rollback_after({step - 1}) before writing it again"
                ) from err
            raise StoreError(f"step {step}: {err} (two rollouts share prompt_index and completion_index?)") from err
        except sqlite3.OperationalError as err:
            raise self._write_failed(f"step {step}", err) from None

    def _write_failed(self, what: str, err: sqlite3.OperationalError) -> StoreError:
        """One line for a write SQLite could not do (a full disk, an I/O error); the steps before it are intact."""
        cause = str(err)
        if getattr(err, "sqlite_errorname", "") == "SQLITE_FULL":
            cause = "No space left on device (ENOSPC; SQLite: database or disk is full)"
        return StoreError(
            f"cannot write {what} to {self.path}: {cause}; the steps before it are intact: fix that, then resume "
            "with resume_from=latest."
        )

    def step_digest(self, step: int) -> str:
        """The digest of step ``step`` as stored (``store/integrity.py``; a checkpoint records the chain of them)."""
        from grpokit.store.integrity import step_digest

        return step_digest(self._conn, step)

    def sync(self) -> None:
        """Make every committed step durable: a WAL checkpoint copies what no reader holds into the database, then
        both files are fsynced. A checkpoint that records the store is written only after this."""
        try:
            self._conn.execute("PRAGMA wal_checkpoint(PASSIVE)")  # copies what no reader holds into the database
        except sqlite3.OperationalError as err:
            raise self._write_failed("the committed steps", err) from None
        for file in (self.path, self.path.with_name(self.path.name + "-wal")):  # and whatever a reader held back
            if file.exists():
                fd = os.open(file, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)

    def _rollout_row(self, step: int, i: int, rollout: RolloutRecord) -> tuple:
        if not isinstance(rollout, RolloutRecord):
            raise StoreError(f"rollout {i} of step {step} is a {type(rollout).__name__}, not a RolloutRecord")
        return (
            self.run_id,
            step,
            rollout.prompt_index,
            rollout.completion_index,
            rollout.prompt,
            rollout.completion,
            rollout.prompt_tokens,
            rollout.completion_tokens,
            rollout.finish_reason,
            json.dumps(rollout.rewards),
            rollout.reward,
            rollout.advantage,
            rollout.policy_version,
            rollout.error,
            None if rollout.extra is None else json.dumps(rollout.extra, default=str, ensure_ascii=False),
            None if rollout.conversation is None else json.dumps(rollout.conversation, default=str, ensure_ascii=False),
            None if rollout.token_versions is None else json.dumps(rollout.token_versions),
            None if rollout.images is None else json.dumps(rollout.images),
        )

    def _has_step(self, step: int) -> bool:
        return self._conn.execute("SELECT 1 FROM steps WHERE step = ?", (step,)).fetchone() is not None

    def write_eval(self, step: int, dataset: str, metrics: dict[str, float], prompts: list[dict] | None = None) -> None:
        """Write the eval metrics (e.g. pass@1) of `dataset` at `step`, and each prompt's result when given
        (``prompts``: dicts with prompt_index, prompt, correct, samples, mean_reward, and for a prompt with images
        their hashes ``images`` and the images ``image_sources``, kept as training's); writing them twice raises."""
        rows = [(step, dataset, name, finite_or_none(value)) for name, value in metrics.items()]
        prompt_rows = [_eval_prompt_row(step, dataset, p) for p in prompts or ()]
        try:
            image_rows = self._images.rows(self._conn, step, list(prompts or ()), evaluation=True)
        except OSError as err:
            folder = self.image_files.folder
            raise StoreError(f"cannot write the images of step {step}'s evaluation to {folder}: {err}") from None
        try:
            with self._transaction():
                self._conn.executemany(images.INSERT, image_rows)
                self._conn.executemany("INSERT INTO evals (step, dataset, name, value) VALUES (?, ?, ?, ?)", rows)
                self._conn.executemany(_INSERT_EVAL_PROMPT, prompt_rows)
        except sqlite3.IntegrityError as err:
            raise DuplicateStepError(f"eval of {dataset!r} at step {step} is already in {self.path}") from err
        except sqlite3.OperationalError as err:
            raise self._write_failed(f"the evaluation of step {step}", err) from None

    def configure_prompt_history(self, window: int, threshold: float) -> None:
        """Keep each prompt's history over its last ``window`` completions, passing at reward >= ``threshold``
        (``prompt_history.configure``: the table is rebuilt when they change)."""
        prompt_history.configure(self._conn, window, threshold)

    def prompt_history(self) -> list[dict]:
        """Each training prompt's history (``store/prompt_history.py``), by prompt_index; [] for an older store."""
        return prompt_history.read(self._conn)

    def rollback_after(self, step: int) -> None:
        """Delete everything of steps > `step`, so a run resumed at `step` writes them once."""
        try:
            with self._transaction():
                before = self._conn.total_changes
                for table in (
                    "steps",
                    "rollouts",
                    "step_metrics",
                    "evals",
                    "eval_prompts",
                    token_values.TABLE,
                    teacher_values.TABLE,
                    images.TABLE,
                ):
                    self._conn.execute(f"DELETE FROM {table} WHERE step > ?", (step,))
                if self._conn.total_changes != before:  # rows removed: the history of what is left
                    prompt_history.rebuild(self._conn)
        except sqlite3.OperationalError as err:
            raise self._write_failed(f"the removal of the steps after step {step}", err) from None
        self.image_files.clean(images.written(self._conn))  # a kill's temporary files, the images of steps gone

    # ----------------------------------------------------------------- reading

    def last_step(self) -> int:
        """The highest written step, 0 for an empty store."""
        sql = "SELECT coalesce(max(step), 0) FROM steps WHERE typeof(step) = 'integer'"
        return self._conn.execute(sql).fetchone()[0]

    def steps(self) -> list[int]:
        """Every written step, ascending."""
        sql = "SELECT step FROM steps WHERE typeof(step) = 'integer' ORDER BY step"
        return [row[0] for row in self._conn.execute(sql)]

    def summary(self) -> list[dict]:
        """One dict per written step: step, n, mean_reward, mean_length, errors."""
        sql = (
            "SELECT steps.step, coalesce(n, 0), mean_reward, mean_length, coalesce(errors, 0) "
            "FROM steps LEFT JOIN step_summary USING (step) ORDER BY steps.step"
        )
        keys = ("step", "n", "mean_reward", "mean_length", "errors")
        out = []
        for row in self._conn.execute(sql):  # the view's numbers, or None where a rebuilt store gives others
            kept = [v if typed_rows.number_or_none(v) else None for v in row]
            if isinstance(kept[0], int) and isinstance(kept[1], int):
                out.append(dict(zip(keys, kept)))
        return out

    def metrics(self) -> list[dict]:
        """One dict per written step: {"step": s, name: value, ...}; a stored null reads as NaN."""
        by_step = {step: {"step": step} for step in self.steps()}
        for step, name, value in self.typed("step_metrics", ("step", "name", "value"), "step, name"):
            if step in by_step:
                by_step[step][name] = _nan_if_null(value)
        return list(by_step.values())

    def evals(self) -> list[dict]:
        """One dict per (step, dataset): {"step": s, "dataset": d, name: value, ...}."""
        by_key: dict[tuple[int, str], dict] = {}
        columns = ("step", "dataset", "name", "value")
        for step, dataset, name, value in self.typed("evals", columns, "step, dataset, name"):
            row = by_key.setdefault((step, dataset), {"step": step, "dataset": dataset})
            row[name] = _nan_if_null(value)
        return list(by_key.values())

    def rollouts(
        self,
        step: int | None = None,
        prompt_index: int | None = None,
        errors_only: bool = False,
        order_by_reward: str | None = None,
        limit: int | None = None,
    ) -> list[dict]:
        """Stored rollouts as dicts (a RolloutRecord's fields plus run_id and step), filtered.

        Ordered by (step, prompt_index, completion_index), or by reward ('desc' or 'asc',
        rollouts without a reward last) when `order_by_reward` is given.
        """
        where, params = [], []
        if step is not None:
            where.append("step = ?")
            params.append(step)
        if prompt_index is not None:
            where.append("prompt_index = ?")
            params.append(prompt_index)
        if errors_only:
            where.append("error IS NOT NULL")
        order = "step, prompt_index, completion_index"
        if order_by_reward is not None:
            if order_by_reward not in ("asc", "desc"):
                raise ValueError(f"order_by_reward must be 'asc' or 'desc', not {order_by_reward!r}")
            order = f"reward IS NULL, reward {order_by_reward.upper()}, {order}"
        present = self._table_columns()
        columns = [c for c in _ROLLOUT_COLUMNS if c not in _ADDED_COLUMNS or c in present]
        sql = f"SELECT {', '.join(columns)} FROM rollouts"
        if where:
            sql += " WHERE " + " AND ".join(where)
        sql += f" ORDER BY {order}"
        if limit is not None:
            sql += " LIMIT ?"
            params.append(int(limit))
        found = (self._rollout(columns, row) for row in self._conn.execute(sql, params))
        return [rollout for rollout in found if rollout is not None]

    def _rollout(self, columns: list[str], row: tuple) -> dict | None:
        """A stored row as a rollout dict, each value of its declared type or None (typed_rows)."""
        found = self._problems
        row = typed_rows.clean("rollouts", columns, row, found)
        if row is None:
            return None
        rollout = dict(zip(columns, row))
        rollout["rewards"] = typed_rows.rewards_of(rollout["rewards"], found)
        rollout["extra"] = typed_rows.load_json(rollout.get("extra"), "rollouts", "extra", found, dict)
        rollout["conversation"] = typed_rows.conversation_of(rollout.get("conversation"), found)
        for column in ("token_versions", "images"):
            rollout[column] = typed_rows.load_json(rollout.get(column), "rollouts", column, found, list)
        for text in ("prompt", "completion", "finish_reason"):  # NOT NULL text: "" when a tampered store had other
            rollout[text] = "" if rollout[text] is None else rollout[text]
        return rollout

    def typed(self, table: str, columns: tuple[str, ...], order: str) -> list[tuple]:
        """``columns`` of every row of ``table`` ordered by ``order``, each value of its declared type or None, rows
        whose identifying columns are not left out (typed_rows.clean); [] when the store has no such table. A column
        the table lacks (a store written before it was added) reads as None."""
        present = self._table_columns(table)
        if not present:
            return []
        sql = f"SELECT {', '.join(c if c in present else 'NULL' for c in columns)} FROM {table} ORDER BY {order}"
        rows = (typed_rows.clean(table, columns, row, self._problems) for row in self._conn.execute(sql))
        return [row for row in rows if row is not None]

    def problems(self) -> list[str]:
        """One line per table and column holding values of the wrong type (a store edited by hand, or rebuilt
        without STRICT tables), counted over the whole store, and the values of the wrong shape read so far."""
        present = [row[0] for row in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")]
        counted = typed_rows.wrong_types(self._conn, [t for t in typed_rows.DECLARED if t in present])
        return typed_rows.problem_lines(counted, self._problems)

    def teacher_logprobs_by_tokens(self, after: int) -> dict[str, list[float]]:
        """The teacher's stored log-probs of the steps after ``after`` by the key of the tokens they score
        (``teacher_values.by_tokens_key``): what a run resumed at ``after`` reuses instead of asking the teacher."""
        return teacher_values.by_tokens_key(self._conn, after)

    def teacher_logprobs(self, step: int | None = None) -> dict[tuple[int, int, int], list[float]]:
        """The teacher's stored log-probs (of ``step``) by (step, prompt_index, completion_index): ``teacher_values
        .read``; {} for a store without them."""
        return teacher_values.read(self._conn, step)

    def images(self, hashes: list[str]) -> dict[str, dict]:
        """What the store holds of the images ``hashes`` (``images.info``: bytes, width, height, step, stored, and
        ``path``, the file when it was written); an image without a row is not there."""
        found = images.info(self._conn, hashes)
        for sha, row in found.items():
            row["path"] = self.image_files.path(sha) if row["stored"] else None
        return found

    def token_values(self, step: int | None = None) -> list[dict]:
        """The per-token values stored (of ``step``): ``token_values.read``; [] for a store without them."""
        return token_values.read(self._conn, step)

    def token_value_names(self) -> list[str]:
        """The per-token values the store holds (``token_values.kept_names``); [] for none."""
        return token_values.kept_names(self._conn)

    def query(self, sql: str) -> tuple[list[str], list[tuple]]:
        """Run one read-only SELECT (or WITH ... SELECT) query; returns (columns, rows): :func:`store.query.run_query`,
        on its own read-only connection whose authorizer refuses anything but reading."""
        if self._query_conn is None:
            self._query_conn = reading_only(self._connect_readonly())
        return run_query(self._query_conn, sql)

    # ----------------------------------------------------------------- lifetime

    def close(self) -> None:
        """Close the connections; safe to call twice."""
        for conn in (self._conn, self._query_conn):
            if conn is not None:
                conn.close()
        self._query_conn = None
        if self._copy is not None:
            shutil.rmtree(self._copy, ignore_errors=True)
            self._copy = None

    def __enter__(self) -> RolloutStore:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
