/**
 * `verify --deep`: every export line the ledger lists is replayed in seq order (the last line of
 * each record wins), together with the changes not published yet, and the result is compared with
 * the mirror: each live or tombstoned message and conversation, each `message_history` version
 * (the version an `update` line replaced), each run that has a line. Every seq up to the watermark
 * must be in exactly one file. Differences are named by key, first by seq.
 *
 * A stub (a line an erasure replaced: src/export/stub.ts) replays as an erased version of its key:
 * it matches a mirror row, or a `message_history` version, that holds a redaction marker
 * (src/store/redaction.ts), whichever erasure's, and nothing else.
 *
 * Files a retention record expired (src/export/retention.ts) are gone: what remains is replayed,
 * and what only their lines could show is not asked for: a seq in an expired file's range is no
 * gap; a history row replaced at such a seq needs no update line; an update whose replaced version
 * expired is not compared with its history row; and a mirror row of a stream and account with
 * expired files that no remaining line holds is not reported (its lines may all have expired; the
 * archive no longer says). Every remaining line must still match the mirror.
 */
import path from 'node:path';
import type { ChangeStream, Mirror } from '../store/mirror.js';
import { redactionOf } from '../store/redaction.js';
import { ERASED_BODY, Replay, type Difference, type ReplayLine } from '../store/replay.js';
import { exportLine, lineBody, recordBody } from './lines.js';
import type { FileState } from './file-states.js';
import { parseStub } from './stub.js';
import { LineSplitter, readDataFile } from './line-stream.js';
import type { VerifyProblem } from './verify-types.js';

/** Differences and line problems named one by one; the rest are counted. */
const SHOWN = 10;

/** What each kind of difference means, in words. */
const SAYS: Record<Difference['kind'], string> = {
  differs: 'the exports say one thing, the mirror another',
  'not-in-mirror': 'in the exports, not in the mirror',
  'not-exported': 'in the mirror, in no export line',
  deleted: 'tombstoned in the mirror, live in the exports',
  'not-deleted': 'deleted in the exports, live in the mirror',
  'history-missing': 'an update line with no message_history row for the version it replaced',
  'history-differs': 'message_history holds another version than the one the update replaced',
  'history-unexported': 'a message_history row with no update line',
};

/**
 * Replays the archive against the mirror; see the module comment.
 *
 * @param files - the data files the records say the archive holds now (src/export/file-states.ts;
 *   files that cannot be read are reported by the file check, and skipped here)
 * @param expired - the files retention records expired (their lines are gone: see the module comment)
 * @returns the problems (kind `deep`), empty when the exports and the mirror agree
 */
export async function deepCheck(mirror: Mirror, root: string, files: readonly FileState[], expired: readonly FileState[] = []): Promise<VerifyProblem[]> {
  const replay = new Replay();
  try {
    replay.batch(() => {
      for (const f of expired) replay.addExpired(f.original.stream as ChangeStream, f.original.account_id, f.original.first_seq, f.original.last_seq);
    });
    const problems = await replayFiles(replay, root, files);
    const watermark = await mirror.exportWatermark();
    await replay.batchAsync(async () => {
      // What is committed but not published yet is part of the mirror's state.
      for await (const c of mirror.changesOf({ first_seq: watermark + 1, last_seq: Number.MAX_SAFE_INTEGER })) {
        replay.addLine(lineOf(c.stream, JSON.parse(exportLine(c)) as Record<string, unknown>));
      }
    });
    for (const g of replay.gaps(watermark, SHOWN)) {
      problems.push({ path: '', problem: 'deep', detail: `seq ${g.from === g.to ? g.from : `${g.from} to ${g.to}`} ${g.from === g.to ? 'is' : 'are'} in no export file (the watermark is ${watermark})` });
    }
    await loadMirror(replay, mirror);
    const { first, total } = replay.differences(SHOWN);
    for (const d of first) {
      const key = d.stream === 'messages' ? `${d.account_id}/${d.conversation_id}/${d.id}` : `${d.account_id}/${d.id}`;
      problems.push({ path: fileOf(files, d) ?? '', problem: 'deep', detail: `${d.stream} ${key}${d.seq === null ? '' : ` (seq ${d.seq})`}: ${SAYS[d.kind]}` });
    }
    if (total > first.length) problems.push({ path: '', problem: 'deep', detail: `and ${total - first.length} more differences` });
    return problems;
  } finally {
    replay.close();
  }
}

/** The file holding the line of difference `d` (its stream, account and seq); undefined for none (no seq, or a change not yet published). */
function fileOf(files: readonly FileState[], d: Difference): string | undefined {
  if (d.seq === null) return undefined;
  const seq = d.seq;
  return files.find((f) => f.original.stream === d.stream && f.original.account_id === d.account_id && f.original.first_seq <= seq && seq <= f.original.last_seq)?.path;
}

/** The replay key and body of a parsed export line of `stream`. */
function lineOf(stream: ChangeStream, line: Record<string, unknown>): ReplayLine {
  const account = String(line.account_id);
  const id = String(line.id);
  return {
    seq: Number(line.seq),
    stream,
    account_id: account,
    conversation_id: stream === 'messages' ? String(line.conversation_id) : stream === 'conversations' ? id : '',
    id,
    op: String(line.op),
    body: lineBody(stream, line),
  };
}

/**
 * Adds every line of every listed file, streamed (a `.gz` decompressed as it is read, within the
 * file check's cap); returns the problems of lines (not JSON, out of range, exported twice). A file
 * that cannot be read is skipped from where it fails (the file check says why).
 */
async function replayFiles(replay: Replay, root: string, files: readonly FileState[]): Promise<VerifyProblem[]> {
  const problems: VerifyProblem[] = [];
  let more = 0;
  const say = (p: VerifyProblem) => (problems.length < SHOWN ? problems.push(p) : more++);
  for (const f of files) {
    await replay.batchAsync(async () => {
      let n = 0;
      const splitter = new LineSplitter((line, _index, terminated) => {
        // An unterminated last line is the file check's problem (its count and hash), not a line.
        if (!terminated) return;
        n++;
        const why = addLine(replay, f, line.toString('utf8'));
        if (why) say({ path: f.path, problem: 'deep', detail: `line ${n}: ${why}` });
      });
      try {
        await readDataFile(path.join(root, f.path), f.path.endsWith('.gz'), (chunk) => splitter.update(chunk));
        splitter.end();
      } catch {
        // Unreadable, not gzip, over the cap, a line over the line cap: the file check names it.
      }
    });
  }
  if (more) problems.push({ path: '', problem: 'deep', detail: `and ${more} more line problems` });
  return problems;
}

/** Adds one line of file `f`; returns why it is wrong, if it is. */
function addLine(replay: Replay, f: FileState, text: string): string | undefined {
  const { first_seq: first, last_seq: last, stream } = f.original;
  const stub = f.rewrittenBy.length > 0 ? parseStub(Buffer.from(text, 'utf8')) : undefined;
  if (stub) {
    if (stub.seq < first || stub.seq > last) return `seq ${stub.seq} outside the file's range ${first}-${last}`;
    const key = { seq: stub.seq, stream: stream as ChangeStream, account_id: stub.account_id, conversation_id: stream === 'runs' ? '' : stub.conversation_id, id: stub.id, op: stub.op, body: ERASED_BODY };
    if (!replay.addLine(key)) return `seq ${stub.seq} is exported twice`;
    return undefined;
  }
  let line: Record<string, unknown>;
  try {
    line = JSON.parse(text) as Record<string, unknown>;
  } catch {
    return 'not JSON';
  }
  if (typeof line !== 'object' || line === null || !Number.isInteger(line.seq)) return 'not an export line (no seq)';
  const seq = line.seq as number;
  if (seq < first || seq > last) return `seq ${seq} outside the file's range ${first}-${last}`;
  if (!replay.addLine(lineOf(stream as ChangeStream, line))) return `seq ${seq} is exported twice`;
  return undefined;
}

/** The mirror's rows in line form: messages, conversations, history, and the runs that ended. */
async function loadMirror(replay: Replay, mirror: Mirror): Promise<void> {
  await replay.batchAsync(async () => {
    for (const table of ['messages', 'conversations'] as const) {
      for await (const r of mirror.auditRecords(table)) {
        const record = r.raw ?? JSON.stringify({ id: r.id });
        const erased = redactionOf(r.raw) !== undefined;
        replay.addLive({ stream: table, account_id: r.account_id, conversation_id: r.conversation_id, id: r.id, deleted: r.deleted !== 0, body: recordBody(table, r.account_id, r.conversation_id, r.id, record), erased });
      }
    }
    for await (const h of mirror.auditHistory()) replay.addHistory(h.seq, h.account_id, h.conversation_id, h.id, recordBody('messages', h.account_id, h.conversation_id, h.id, h.raw), redactionOf(h.raw) !== undefined);
    for (const run of await mirror.auditRuns()) {
      // A run still running was taken up again after a line said it ended: nothing to compare yet.
      const body = run.status === 'running' ? null : recordBody('runs', run.accountId, '', String(run.id), run.record);
      replay.addLive({ stream: 'runs', account_id: run.accountId, conversation_id: '', id: String(run.id), deleted: false, body });
    }
  });
}
