"""SQLite schema of a run's rollout store (`RUN/rollouts.sqlite`).

One row per completion in `rollouts`; each reward function's value lives in the JSON column
`rewards` (`{"accuracy": 1.0, "format": null}`), so adding a reward function never migrates the
schema. `extra` holds the columns reward functions logged with `log_extra` (JSON, null when none);
stores written before it existed get it when opened for writing. `advantage` is null for a completion
the step did not train on (dynamic sampling dropped its group, whose rewards all tie). `conversation` holds a
multi-turn rollout's turns (JSON: stop_reason, tool_rounds, turns with role, text, tool calls, tool name,
arguments, status, error, token span, start and duration; null for a single-turn completion). `token_versions`
holds a partial rollout's per-token policy versions as runs `[[first_token, version], ...]` (null: every token by
`policy_version`; grpokit/store/versions.py). `images` lists the sha256 of each image of the completion's prompt
(JSON, null for a prompt without images); the `images` table describes each one once (grpokit/store/images.py). Stores
written
before these columns existed get them when opened for writing, and are read without them. The
`reward_values` view unpacks `rewards` to one row per (rollout, reward function) and `step_summary` gives the
per-step numbers `grpokit inspect` prints, which keeps ad-hoc `grpokit inspect RUN --sql "..."` queries short:

    SELECT name, avg(value) FROM reward_values GROUP BY name
    SELECT step, json_extract(rewards, '$.accuracy') FROM rollouts WHERE error IS NOT NULL
    SELECT json_extract(extra, '$.judge_reason') FROM rollouts
    SELECT step, json_extract(conversation, '$.tool_rounds') FROM rollouts
    SELECT r.step, i.sha256, i.bytes FROM rollouts r, json_each(r.images) j JOIN images i ON i.sha256 = j.value
    SELECT p.step, p.prompt_index, j.value FROM eval_prompts p, json_each(p.images) j
"""

SCHEMA_VERSION = 1

# Tables are STRICT (SQLite >= 3.37): a value of another type than the column's is refused on write, so a store
# this grpokit creates holds no text where a number belongs. Stores created before keep their tables as they are
# (CREATE TABLE IF NOT EXISTS leaves them) and are read as before; their readers replace a value of the wrong type
# (a store edited by hand) with None and say so (store/typed_rows.py).

# `steps` marks a step as written: its primary key is what refuses a second write of a step, and
# because the marker is inserted in the same transaction as the step's rows, a step is either
# entirely present or absent after a crash.
SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS steps (
    step       INTEGER PRIMARY KEY,
    written_at REAL NOT NULL
) STRICT;
CREATE TABLE IF NOT EXISTS rollouts (
    id                INTEGER PRIMARY KEY,
    run_id            TEXT NOT NULL,
    step              INTEGER NOT NULL,
    prompt_index      INTEGER NOT NULL,
    completion_index  INTEGER NOT NULL,
    prompt            TEXT NOT NULL,
    completion        TEXT NOT NULL,
    prompt_tokens     INTEGER NOT NULL,
    completion_tokens INTEGER NOT NULL,
    finish_reason     TEXT NOT NULL,
    rewards           TEXT NOT NULL,
    reward            REAL,
    advantage         REAL,
    policy_version    INTEGER NOT NULL,
    error             TEXT,
    extra             TEXT,
    conversation      TEXT,
    token_versions    TEXT,
    images            TEXT,
    UNIQUE (step, prompt_index, completion_index)
) STRICT;
CREATE TABLE IF NOT EXISTS step_metrics (
    step  INTEGER NOT NULL,
    name  TEXT NOT NULL,
    value REAL,
    PRIMARY KEY (step, name)
) STRICT;
CREATE TABLE IF NOT EXISTS evals (
    step    INTEGER NOT NULL,
    dataset TEXT NOT NULL,
    name    TEXT NOT NULL,
    value   REAL,
    PRIMARY KEY (step, dataset, name)
) STRICT;
-- Each held-out prompt's result in an evaluation: `correct` of its `samples` completions reached the success
-- threshold (the report's held-out view: prompts learned, never solved, forgotten). Stores written before it
-- existed get it when opened for writing; readers treat its absence as no per-prompt results. `images`: the sha256
-- of each image of the prompt, as the rollouts' column (null: a text prompt, or a store written before it).
CREATE TABLE IF NOT EXISTS eval_prompts (
    step         INTEGER NOT NULL,
    dataset      TEXT NOT NULL,
    prompt_index INTEGER NOT NULL,
    prompt       TEXT NOT NULL,
    correct      INTEGER NOT NULL,
    samples      INTEGER NOT NULL,
    mean_reward  REAL,
    images       TEXT,
    PRIMARY KEY (step, dataset, prompt_index)
) STRICT;
-- Per-token values of a completion, kept only when run.store_token_values asks (grpokit/store/token_values.py):
-- `tokens` the completion's tokens, each decoded on its own (JSON list); each value column one float16
-- (little-endian) per token, null when not kept. Stores written before it existed get it when opened for writing;
-- readers treat its absence as no per-token values.
CREATE TABLE IF NOT EXISTS token_values (
    step             INTEGER NOT NULL,
    prompt_index     INTEGER NOT NULL,
    completion_index INTEGER NOT NULL,
    tokens           TEXT NOT NULL,
    logprob          BLOB,
    gap              BLOB,
    entropy          BLOB,
    weight           BLOB,
    PRIMARY KEY (step, prompt_index, completion_index)
) STRICT;
-- The teacher's log-prob of every sampled token of a completion trained on (on-policy distillation;
-- grpokit/store/teacher_values.py): little-endian float32, one per token. Stores written before it existed get it
-- when opened for writing; readers treat its absence as no teacher log-probs. `tokens_key` names the teacher and
-- the scored tokens (prompt and completion ids), so a resumed run reuses the values of the same tokens (null: older).
CREATE TABLE IF NOT EXISTS teacher_logprobs (
    step             INTEGER NOT NULL,
    prompt_index     INTEGER NOT NULL,
    completion_index INTEGER NOT NULL,
    logprob          BLOB NOT NULL,
    tokens_key       TEXT,
    PRIMARY KEY (step, prompt_index, completion_index)
) STRICT;
-- Each distinct image the prompts showed, once (grpokit/store/images.py): `stored` 1 when RUN/images/<sha256>.png
-- holds it, 0 when it passed run.store_images_max_mb; `step` the first step that showed it (rolled back with it);
-- `eval` 1 when that step's evaluation showed it first (each eval_prompts row's `images` names its prompt's images).
CREATE TABLE IF NOT EXISTS images (
    sha256 TEXT PRIMARY KEY,
    step   INTEGER NOT NULL,
    bytes  INTEGER NOT NULL,
    width  INTEGER NOT NULL,
    height INTEGER NOT NULL,
    stored INTEGER NOT NULL,
    eval   INTEGER NOT NULL DEFAULT 0
) STRICT;
CREATE VIEW IF NOT EXISTS reward_values AS
    SELECT r.id AS rollout_id, r.step, r.prompt_index, r.completion_index,
           j.key AS name, j.value AS value
    FROM rollouts AS r, json_each(r.rewards) AS j;
CREATE VIEW IF NOT EXISTS step_summary AS
    SELECT step,
           count(*) AS n,
           avg(reward) AS mean_reward,
           avg(completion_tokens) AS mean_length,
           sum(error IS NOT NULL) AS errors
    FROM rollouts GROUP BY step;
"""


def schema_sql(sqlite_version: tuple[int, int, int]) -> str:
    """:data:`SCHEMA` for an SQLite of ``sqlite_version``: without STRICT before 3.37, which does not know it (the
    readers check the types then: store/typed_rows.py)."""
    return SCHEMA if sqlite_version >= (3, 37, 0) else SCHEMA.replace(") STRICT;", ");")
