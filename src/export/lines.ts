/**
 * The export line format: one JSON object per change-log row, `seq` first. This is the only place
 * that decides the bytes of a line; the store keeps the facts (the record as served, the op, when
 * and where) and the exporter writes what {@link exportLine} returns, one line per row.
 *
 * A message line: `{"seq","op","synced_at","account_id","conversation_id","id","content",
 * "visibility","sender":{"id","name","type"},"attachments" (only when the API served the field),
 * "created_at"}`. A conversation line: `{"seq","op","synced_at","account_id","id","data"}`, `data`
 * being the conversation object as served (`{"id": ...}` for one only known by id). A `delete`
 * carries the record's last known version. A run line: `{"seq","op","synced_at"}` (`synced_at`:
 * when the run ended; `op` `insert` the first time a run ends, `update` if it ends again) followed
 * by the run's record (`account_id`, `id`, `scope`, `refresh`, `trigger`, `started_at`, `ended_at`,
 * `status`, figures, `failures`, `ledger_head`: see `Runs.lineRecord` in src/store/sqlite/runs.ts).
 */
import type { ExportChange } from '../store/mirror.js';
import { redactionOf } from '../store/redaction.js';
import { ExportError } from '../errors.js';

/** The fields of a change-log row a line is built from. */
export type LineSource = Pick<ExportChange, 'seq' | 'stream' | 'op' | 'account_id' | 'conversation_id' | 'record_id' | 'synced_at' | 'record' | 'line'>;

/** The message line's fields after `seq`, in their written order, from a served message object. */
function messageFields(c: LineSource, message: Record<string, unknown>): Record<string, unknown> {
  const sender = (message.sender ?? {}) as Record<string, unknown>;
  const out: Record<string, unknown> = {
    op: c.op,
    synced_at: c.synced_at,
    account_id: c.account_id,
    conversation_id: c.conversation_id,
    id: message.id,
    content: message.content,
    visibility: message.visibility,
    sender: { id: sender.id, name: sender.name, type: sender.type },
  };
  if (message.attachments !== undefined) out.attachments = message.attachments;
  out.created_at = message.created_at;
  return out;
}

/** The fields after `seq` of the line of a message whose record is a redaction marker. */
function redactedMessageFields(c: LineSource, marker: Record<string, unknown>): Record<string, unknown> {
  return { op: c.op, synced_at: c.synced_at, account_id: c.account_id, conversation_id: c.conversation_id, id: marker.id, created_at: marker.created_at, redacted: marker.redacted };
}

/** The conversation line's fields after `seq`, in their written order. */
function conversationFields(c: LineSource, conversation: unknown): Record<string, unknown> {
  return { op: c.op, synced_at: c.synced_at, account_id: c.account_id, id: c.record_id, data: conversation };
}

/** The run line's fields after `seq`: `op`, `synced_at`, then the run's record as stored. */
function runFields(c: LineSource, run: unknown): Record<string, unknown> {
  return { op: c.op, synced_at: c.synced_at, ...(run as Record<string, unknown>) };
}

/**
 * What a line says of its record, for comparing an export line with a mirror row (`verify
 * --deep`): the line's fields without `seq`, `op` and `synced_at` (and, for a run, without
 * `ledger_head`, which the mirror's `runs` row replaces by the later head), as compact JSON in
 * their written order.
 */
export function lineBody(stream: LineSource['stream'], line: Record<string, unknown>): string {
  const { seq: _seq, op: _op, synced_at: _at, ...rest } = line;
  if (stream === 'runs') delete rest.ledger_head;
  return JSON.stringify(rest);
}

/**
 * {@link lineBody} of the line a record would be exported as: a message or conversation as served
 * (JSON), or a run's record.
 */
export function recordBody(stream: LineSource['stream'], accountId: string, conversationId: string, recordId: string, record: string): string {
  const line = JSON.parse(exportLine({ seq: 0, stream, op: 'insert', account_id: accountId, conversation_id: conversationId, record_id: recordId, synced_at: '', record, line: null }));
  return lineBody(stream, line as Record<string, unknown>);
}

/**
 * The export line of one change-log row, without the trailing newline (the exporter adds `\n`).
 *
 * A row written before schema version 6 carries its finished line without `seq` (`line`): the
 * result is `{"seq":<seq>,` followed by that line after its `{`, byte for byte what was exported
 * then. A newer row carries the record (`record`): the line is built from it as above.
 *
 * @throws {@link ExportError} naming the seq when the row has neither `line` nor `record`, or its
 *   `record` is not JSON (the change log was written by something else)
 */
export function exportLine(change: LineSource): string {
  if (change.line !== null) return `{"seq":${change.seq},${change.line.slice(1)}`;
  if (change.record === null) throw new ExportError(`change_log row ${change.seq} has neither a record nor a line`, { seq: change.seq });
  let record: unknown;
  try {
    record = JSON.parse(change.record);
  } catch (err) {
    throw new ExportError(`change_log row ${change.seq} holds a record that is not JSON`, { seq: change.seq }, err);
  }
  const fields =
    change.stream === 'messages'
      ? redactionOf(change.record) !== undefined
        ? redactedMessageFields(change, record as Record<string, unknown>)
        : messageFields(change, (record ?? {}) as Record<string, unknown>)
      : change.stream === 'runs'
        ? runFields(change, record)
        : conversationFields(change, record);
  return `{"seq":${change.seq},${JSON.stringify(fields).slice(1)}`;
}
