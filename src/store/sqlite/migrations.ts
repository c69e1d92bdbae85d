/**
 * Schema migrations, applied in order; `PRAGMA user_version` holds how many have run.
 * Append new migrations; never edit a released one.
 */
export const MIGRATIONS: readonly string[] = [
  /* 1: the mirror, the change log (transactional outbox), checkpoints, runs and export bookkeeping */ `
  CREATE TABLE conversations (
    account_id     TEXT NOT NULL,
    id             TEXT NOT NULL,
    raw            TEXT,              -- the object exactly as served by GET /v1/conversations (JSON); NULL until listed
    message_count  INTEGER,           -- messages served at the last complete crawl
    last_synced_at TEXT,              -- end of the last complete crawl (ISO 8601 UTC)
    deleted_at     TEXT,              -- tombstone: the API answered 404
    first_seen_at  TEXT NOT NULL,
    updated_at     TEXT NOT NULL,     -- last time raw changed
    PRIMARY KEY (account_id, id)
  );

  CREATE TABLE messages (
    account_id      TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    id              TEXT NOT NULL,
    position        INTEGER NOT NULL, -- 0-based chronological index at the last crawl
    content         TEXT NOT NULL,
    visibility      TEXT NOT NULL,
    sender_id       TEXT NOT NULL,
    sender_name     TEXT NOT NULL,
    sender_type     TEXT NOT NULL,
    attachments     TEXT,             -- JSON as served; NULL when the API omitted the field
    created_at      TEXT NOT NULL,
    raw             TEXT NOT NULL,    -- the object exactly as served (JSON)
    first_seen_at   TEXT NOT NULL,
    updated_at      TEXT NOT NULL,    -- last time raw changed
    deleted_at      TEXT,             -- tombstone: no longer served after a complete crawl
    PRIMARY KEY (account_id, conversation_id, id)
  );
  CREATE INDEX messages_by_position ON messages (account_id, conversation_id, position);

  -- Earlier versions of edited messages: an edit never erases what an archive saw.
  CREATE TABLE message_history (
    account_id      TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    id              TEXT NOT NULL,
    raw             TEXT NOT NULL,    -- the superseded version
    valid_from      TEXT NOT NULL,    -- when that version was first mirrored
    valid_to        TEXT NOT NULL,    -- when it was replaced
    replaced_by_seq INTEGER NOT NULL  -- change_log.seq of the update that replaced it
  );
  CREATE INDEX message_history_by_id ON message_history (account_id, conversation_id, id);

  -- Transactional outbox: one row per insert, update or delete, written in the same transaction as
  -- the row change. Exports are produced from here, never from the API.
  CREATE TABLE change_log (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    stream          TEXT NOT NULL CHECK (stream IN ('messages', 'conversations')),
    op              TEXT NOT NULL CHECK (op IN ('insert', 'update', 'delete')),
    account_id      TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    record_id       TEXT NOT NULL,
    synced_at       TEXT NOT NULL,
    run_id          INTEGER,
    line            TEXT NOT NULL     -- the export line without seq (JSON object)
  );

  -- Per-conversation crawl checkpoint: the next page to fetch and the ids seen so far in this crawl.
  CREATE TABLE checkpoints (
    account_id       TEXT NOT NULL,
    conversation_id  TEXT NOT NULL,
    next_page        INTEGER NOT NULL,
    total_count      INTEGER NOT NULL,
    crawl_started_at TEXT NOT NULL,
    run_id           INTEGER,
    updated_at       TEXT NOT NULL,
    PRIMARY KEY (account_id, conversation_id)
  );
  CREATE TABLE crawl_pages (
    account_id      TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    page            INTEGER NOT NULL,
    ids             TEXT NOT NULL,    -- JSON array of the message ids served on that page
    PRIMARY KEY (account_id, conversation_id, page)
  );

  CREATE TABLE runs (
    id                     INTEGER PRIMARY KEY AUTOINCREMENT,
    mode                   TEXT NOT NULL,   -- full | conversations
    account_id             TEXT NOT NULL,
    started_at             TEXT NOT NULL,
    ended_at               TEXT,
    status                 TEXT NOT NULL,   -- running | succeeded | partial | failed | interrupted
    list_passes            INTEGER NOT NULL DEFAULT 0,
    conversations_listed   INTEGER NOT NULL DEFAULT 0,
    conversations_synced   INTEGER NOT NULL DEFAULT 0,
    conversations_failed   INTEGER NOT NULL DEFAULT 0,
    conversations_deleted  INTEGER NOT NULL DEFAULT 0,
    conversations_inserted INTEGER NOT NULL DEFAULT 0,
    conversations_updated  INTEGER NOT NULL DEFAULT 0,
    messages_served        INTEGER NOT NULL DEFAULT 0,
    messages_inserted      INTEGER NOT NULL DEFAULT 0,
    messages_updated       INTEGER NOT NULL DEFAULT 0,
    messages_deleted       INTEGER NOT NULL DEFAULT 0,
    requests               INTEGER NOT NULL DEFAULT 0,
    retries                INTEGER NOT NULL DEFAULT 0,
    rate_limited           INTEGER NOT NULL DEFAULT 0,
    export_lines           INTEGER NOT NULL DEFAULT 0,
    export_files           INTEGER NOT NULL DEFAULT 0,
    error                  TEXT
  );
  CREATE TABLE run_failures (
    run_id          INTEGER NOT NULL REFERENCES runs (id),
    conversation_id TEXT NOT NULL,
    code            TEXT NOT NULL,
    status          INTEGER,
    attempts        INTEGER,
    message         TEXT NOT NULL,
    at              TEXT NOT NULL
  );

  -- Exports: the watermark is the last change_log.seq published. A batch is planned (its seq range
  -- fixed) before any file is written, so re-publishing after a crash gives the same files.
  CREATE TABLE export_state (
    id        INTEGER PRIMARY KEY CHECK (id = 1),
    watermark INTEGER NOT NULL
  );
  INSERT INTO export_state (id, watermark) VALUES (1, 0);
  CREATE TABLE export_batches (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    first_seq    INTEGER NOT NULL,
    last_seq     INTEGER NOT NULL,
    planned_at   TEXT NOT NULL,
    published_at TEXT,
    run_id       INTEGER
  );
  CREATE TABLE export_files (
    path         TEXT PRIMARY KEY,  -- relative to the export directory, '/'-separated
    batch_id     INTEGER NOT NULL REFERENCES export_batches (id),
    stream       TEXT NOT NULL,
    account_id   TEXT NOT NULL,
    date         TEXT NOT NULL,
    first_seq    INTEGER NOT NULL,
    last_seq     INTEGER NOT NULL,
    lines        INTEGER NOT NULL,
    bytes        INTEGER NOT NULL,
    sha256       TEXT NOT NULL,
    published_at TEXT NOT NULL
  );
  `,
  /* 2: a random id per mirror, written into the export manifest so an export directory is never
        shared by two mirrors (their seq numbers would collide) */ `
  CREATE TABLE mirror_meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
  );
  INSERT INTO mirror_meta (key, value) VALUES ('mirror_id', lower(hex(randomblob(16))));
  `,
  /* 3: the change signal (e.g. last_activity_at) a conversation showed at its last complete crawl */ `
  ALTER TABLE conversations ADD COLUMN crawled_signal TEXT;
  `,
  /* 4: how many times a run was resumed after its process died (see Mirror.resumeRun) */ `
  ALTER TABLE runs ADD COLUMN resumes INTEGER NOT NULL DEFAULT 0;
  `,
  /* 5: what a run covered, how deep and who asked, instead of the ambiguous mode (which meant
        "whole workspace" for sync and "full refresh" for the daemon). Older rows keep what can be
        told from their mode; the rest stays NULL (unknown). New rows write mode = scope. */ `
  ALTER TABLE runs ADD COLUMN scope TEXT;    -- workspace | conversations
  ALTER TABLE runs ADD COLUMN refresh TEXT;  -- incremental | full
  ALTER TABLE runs ADD COLUMN trigger TEXT;  -- cli | schedule | on-demand | webhook
  UPDATE runs SET scope = CASE mode WHEN 'conversations' THEN 'conversations' ELSE 'workspace' END;
  UPDATE runs SET refresh = 'incremental' WHERE mode = 'scheduled';
  `,
  /* 6: the change log keeps the record, not the export line: the line's format belongs to the
        exporter (src/export/lines.ts). change_log is rebuilt with a nullable line (kept on the rows
        written by older versions, which are exported as they are) and a record column (the record's
        served JSON). Every row keeps its seq, and the AUTOINCREMENT counter is carried over, so no
        seq is ever handed out twice. */ `
  CREATE TABLE change_log_v6 (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    stream          TEXT NOT NULL CHECK (stream IN ('messages', 'conversations')),
    op              TEXT NOT NULL CHECK (op IN ('insert', 'update', 'delete')),
    account_id      TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    record_id       TEXT NOT NULL,
    synced_at       TEXT NOT NULL,
    run_id          INTEGER,
    line            TEXT,             -- legacy: the export line without seq, on rows written before version 6
    record          TEXT,             -- the record as served (JSON): a message (a delete: its last version), a conversation ({"id": ...} when only known by id)
    CHECK (line IS NOT NULL OR record IS NOT NULL)
  );
  INSERT INTO change_log_v6 (seq, stream, op, account_id, conversation_id, record_id, synced_at, run_id, line, record)
    SELECT seq, stream, op, account_id, conversation_id, record_id, synced_at, run_id, line, NULL FROM change_log ORDER BY seq;
  -- The copy set change_log_v6's counter to its largest seq; the old counter may be higher.
  UPDATE sqlite_sequence SET seq = max(seq, (SELECT seq FROM sqlite_sequence WHERE name = 'change_log'))
    WHERE name = 'change_log_v6' AND EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'change_log');
  INSERT INTO sqlite_sequence (name, seq)
    SELECT 'change_log_v6', seq FROM sqlite_sequence
    WHERE name = 'change_log' AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'change_log_v6');
  DROP TABLE change_log;
  ALTER TABLE change_log_v6 RENAME TO change_log;
  -- A run's figures are counted from its own change-log rows (Mirror.runChanges).
  CREATE INDEX change_log_by_run ON change_log (run_id);
  `,
  /* 7: the archive proves itself. A third change-log stream, `runs` (one line per finished run),
        needs change_log rebuilt with a wider CHECK (every seq and the AUTOINCREMENT counter carried
        over, as in 6). `ledger` holds the hash chain of published batch records
        (`_ledger/<batch>.json` in the export directory); a batch remembers whether it is gzipped, so
        a batch re-published after a crash keeps its file names; a run remembers the chain head it
        left. */ `
  CREATE TABLE change_log_v7 (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    stream          TEXT NOT NULL CHECK (stream IN ('messages', 'conversations', 'runs')),
    op              TEXT NOT NULL CHECK (op IN ('insert', 'update', 'delete')),
    account_id      TEXT NOT NULL,
    conversation_id TEXT NOT NULL,    -- '' on a runs row
    record_id       TEXT NOT NULL,    -- a runs row: the run id
    synced_at       TEXT NOT NULL,    -- a runs row: when the run ended
    run_id          INTEGER,
    line            TEXT,             -- legacy: the export line without seq, on rows written before version 6
    record          TEXT,             -- the record as served (JSON); a runs row: the run's record (see Runs.lineRecord)
    CHECK (line IS NOT NULL OR record IS NOT NULL)
  );
  INSERT INTO change_log_v7 (seq, stream, op, account_id, conversation_id, record_id, synced_at, run_id, line, record)
    SELECT seq, stream, op, account_id, conversation_id, record_id, synced_at, run_id, line, record FROM change_log ORDER BY seq;
  UPDATE sqlite_sequence SET seq = max(seq, (SELECT seq FROM sqlite_sequence WHERE name = 'change_log'))
    WHERE name = 'change_log_v7' AND EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'change_log');
  INSERT INTO sqlite_sequence (name, seq)
    SELECT 'change_log_v7', seq FROM sqlite_sequence
    WHERE name = 'change_log' AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'change_log_v7');
  DROP TABLE change_log;
  ALTER TABLE change_log_v7 RENAME TO change_log;
  CREATE INDEX change_log_by_run ON change_log (run_id);

  ALTER TABLE export_batches ADD COLUMN gzip INTEGER NOT NULL DEFAULT 0;

  -- One row per batch record published: the chain the records in _ledger/ must form.
  CREATE TABLE ledger (
    batch_id     INTEGER PRIMARY KEY, -- the batch the record covers (a migrated export directory's genesis record: the last batch published before it)
    hash         TEXT NOT NULL UNIQUE,-- SHA-256 (hex) of the record's canonical body
    prev_hash    TEXT,                -- the previous record's hash; NULL for the genesis record
    path         TEXT NOT NULL,       -- the record's file, relative to the export directory
    files        INTEGER NOT NULL,
    lines        INTEGER NOT NULL,
    key_id       TEXT,                -- the signing key's id when the record is signed
    published_at TEXT NOT NULL
  );

  ALTER TABLE runs ADD COLUMN ledger_batch_id INTEGER; -- the chain head when the run ended (after its runs line was published)
  ALTER TABLE runs ADD COLUMN ledger_hash TEXT;
  `,
  /* 8: a lean mirror. `raw` is the truth of a message: the columns derived from it (content,
        visibility, sender_*, attachments, created_at) become VIRTUAL generated columns (computed
        when read, no bytes on disk; queries keep working), and the position index goes (a
        position lookup walks one conversation's primary-key range). A change's payload (`record`,
        legacy `line`) moves out of change_log into change_payloads, where it stays only until its
        batch is published and recorded (the exports are then the copy); deleting a published
        range there frees whole pages. Payloads already published are not carried over. change_log
        is rebuilt as in 6 and 7: every seq and the AUTOINCREMENT counter carried over. */ `
  CREATE TABLE messages_v8 (
    account_id      TEXT NOT NULL,
    conversation_id TEXT NOT NULL,
    id              TEXT NOT NULL,
    position        INTEGER NOT NULL, -- 0-based chronological index at the last crawl
    raw             TEXT NOT NULL,    -- the object exactly as served (JSON): the source of truth
    first_seen_at   TEXT NOT NULL,
    updated_at      TEXT NOT NULL,    -- last time raw changed
    deleted_at      TEXT,             -- tombstone: no longer served after a complete crawl
    content         TEXT GENERATED ALWAYS AS (json_extract(raw, '$.content')) VIRTUAL,
    visibility      TEXT GENERATED ALWAYS AS (json_extract(raw, '$.visibility')) VIRTUAL,
    sender_id       TEXT GENERATED ALWAYS AS (json_extract(raw, '$.sender.id')) VIRTUAL,
    sender_name     TEXT GENERATED ALWAYS AS (json_extract(raw, '$.sender.name')) VIRTUAL,
    sender_type     TEXT GENERATED ALWAYS AS (json_extract(raw, '$.sender.type')) VIRTUAL,
    attachments     TEXT GENERATED ALWAYS AS (json_extract(raw, '$.attachments')) VIRTUAL, -- JSON; NULL when not served
    created_at      TEXT GENERATED ALWAYS AS (json_extract(raw, '$.created_at')) VIRTUAL,
    PRIMARY KEY (account_id, conversation_id, id)
  );
  INSERT INTO messages_v8 (account_id, conversation_id, id, position, raw, first_seen_at, updated_at, deleted_at)
    SELECT account_id, conversation_id, id, position, raw, first_seen_at, updated_at, deleted_at FROM messages
    ORDER BY account_id, conversation_id, id;
  DROP TABLE messages;
  ALTER TABLE messages_v8 RENAME TO messages;

  -- A change's payload until its batch is published and recorded (ExportLedger.record deletes it).
  CREATE TABLE change_payloads (
    seq    INTEGER PRIMARY KEY,       -- change_log.seq
    record TEXT,                      -- the record as served (JSON); see change_log in version 7
    line   TEXT,                      -- legacy: the export line without seq, on rows written before version 6
    CHECK (line IS NOT NULL OR record IS NOT NULL)
  );
  INSERT INTO change_payloads (seq, record, line)
    SELECT seq, record, line FROM change_log WHERE seq > (SELECT watermark FROM export_state WHERE id = 1) ORDER BY seq;

  CREATE TABLE change_log_v8 (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    stream          TEXT NOT NULL CHECK (stream IN ('messages', 'conversations', 'runs')),
    op              TEXT NOT NULL CHECK (op IN ('insert', 'update', 'delete')),
    account_id      TEXT NOT NULL,
    conversation_id TEXT NOT NULL,    -- '' on a runs row
    record_id       TEXT NOT NULL,    -- a runs row: the run id
    synced_at       TEXT NOT NULL,    -- a runs row: when the run ended
    run_id          INTEGER
  );
  INSERT INTO change_log_v8 (seq, stream, op, account_id, conversation_id, record_id, synced_at, run_id)
    SELECT seq, stream, op, account_id, conversation_id, record_id, synced_at, run_id FROM change_log ORDER BY seq;
  UPDATE sqlite_sequence SET seq = max(seq, (SELECT seq FROM sqlite_sequence WHERE name = 'change_log'))
    WHERE name = 'change_log_v8' AND EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'change_log');
  INSERT INTO sqlite_sequence (name, seq)
    SELECT 'change_log_v8', seq FROM sqlite_sequence
    WHERE name = 'change_log' AND NOT EXISTS (SELECT 1 FROM sqlite_sequence WHERE name = 'change_log_v8');
  DROP TABLE change_log;
  ALTER TABLE change_log_v8 RENAME TO change_log;
  CREATE INDEX change_log_by_run ON change_log (run_id);
  `,
  /* 9: erasures (issue 26, the mirror side). One row per erasure asked of the mirror: whose data
        (a sender of an account, or a conversation), why, when, what the mirror redacted, and what
        the archive step must rewrite (every published line at or below published_through_seq).
        A redacted record is a marker (src/store/redaction.ts); the derived message columns read
        NULL for it, and none of them is NOT NULL since version 8, so no constraint changes. Pages
        committed later look their erasures up by (account_id, kind, subject). */ `
  CREATE TABLE erasures (
    id                    INTEGER PRIMARY KEY,  -- ascending from 1 (rows are never deleted)
    kind                  TEXT NOT NULL CHECK (kind IN ('sender', 'conversation')),
    account_id            TEXT NOT NULL,
    subject               TEXT NOT NULL,        -- the sender id or the conversation id
    reason                TEXT NOT NULL CHECK (length(trim(reason)) > 0),
    requested_at          TEXT NOT NULL,        -- ISO 8601 UTC, the mirror's clock
    messages              INTEGER NOT NULL,     -- messages rows redacted
    history               INTEGER NOT NULL,     -- message_history rows redacted
    pending_changes       INTEGER NOT NULL,     -- unpublished change payloads redacted
    conversations         INTEGER NOT NULL,     -- conversations rows redacted (0 or 1)
    published_lines       INTEGER NOT NULL,     -- change-log lines at or below published_through_seq that concern the subject
    published_through_seq INTEGER NOT NULL,     -- every line at or below it may be published: the archive step rewrites them
    archive_done_at       TEXT                  -- when the archive step finished; NULL until then
  );
  CREATE INDEX erasures_by_subject ON erasures (account_id, kind, subject);
  `,
  /* 10: the archive step of erasures (issue 26, item 2): the batch id of the erasure record it
         published in the ledger, recorded with the record (in the transaction that moves the chain
         head), so an archive step interrupted after that point deletes the files the record
         replaced and does not publish the record again. */ `
  ALTER TABLE erasures ADD COLUMN archive_batch_id INTEGER; -- the erasure record's batch id in the ledger; NULL until recorded
  `,
  /* 11: retention (issue 26, item 3): the batch id of the retention record that expired a published
         file, set with the record (in the transaction that moves the chain head); NULL while the
         archive holds it. An expired row stays: the mirror knows what the archive no longer holds. */ `
  ALTER TABLE export_files ADD COLUMN expired_by INTEGER; -- the retention record's batch id; NULL while held
  `,
  /* 12: retention erasures (issue 26, item 3, --prune-mirror): kind 'retention', whose subject is a
         cutoff day (every message of the account created before it). SQLite cannot change a CHECK
         in place: the table is rebuilt, same columns in the same order, same rows and ids. */ `
  CREATE TABLE erasures_v12 (
    id                    INTEGER PRIMARY KEY,  -- ascending from 1 (rows are never deleted)
    kind                  TEXT NOT NULL CHECK (kind IN ('sender', 'conversation', 'retention')),
    account_id            TEXT NOT NULL,
    subject               TEXT NOT NULL,        -- the sender id, the conversation id, or the cutoff day (YYYY-MM-DD)
    reason                TEXT NOT NULL CHECK (length(trim(reason)) > 0),
    requested_at          TEXT NOT NULL,        -- ISO 8601 UTC, the mirror's clock
    messages              INTEGER NOT NULL,     -- messages rows redacted
    history               INTEGER NOT NULL,     -- message_history rows redacted
    pending_changes       INTEGER NOT NULL,     -- unpublished change payloads redacted
    conversations         INTEGER NOT NULL,     -- conversations rows redacted
    published_lines       INTEGER NOT NULL,     -- change-log lines at or below published_through_seq that concern the subject
    published_through_seq INTEGER NOT NULL,     -- every line at or below it may be published: the archive step rewrites them
    archive_done_at       TEXT,                 -- when the archive step finished; NULL until then
    archive_batch_id      INTEGER               -- the erasure record's batch id in the ledger; NULL until recorded
  );
  INSERT INTO erasures_v12 (id, kind, account_id, subject, reason, requested_at, messages, history, pending_changes, conversations,
                            published_lines, published_through_seq, archive_done_at, archive_batch_id)
    SELECT id, kind, account_id, subject, reason, requested_at, messages, history, pending_changes, conversations,
           published_lines, published_through_seq, archive_done_at, archive_batch_id FROM erasures ORDER BY id;
  DROP TABLE erasures;
  ALTER TABLE erasures_v12 RENAME TO erasures;
  CREATE INDEX erasures_by_subject ON erasures (account_id, kind, subject);
  `,
];
