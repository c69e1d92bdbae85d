/**
 * JSONL change exports: replay equals the mirror, layout, line shapes, manifest, verification,
 * crash-safe re-publication and temp-file cleanup (in `.convo-mirror-tmp/` only). Real files in temp dirs, each engine of the
 * store (the conformance suite: test/engines.ts), the real fake over HTTP.
 */
import crypto from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { FakeWorkspace } from '../src/fake-api/index.js';
import { MANIFEST, TEMP_DIR, publishChanges, verifyExports, type Manifest } from '../src/export/exporter.js';
import { ledgerFiles, linesMerkleRoot } from './helpers.js';
import { syncWorkspace } from '../src/sync/workspace.js';
import { testClock } from './clock.js';
import { sqlAll } from './sql.js';
import { engines } from './engines.js';
import { changeRows, maxSeq as topSeq, mirrorMatchesFake, records } from './mirror-reads.js';
import {
  ACCOUNT_ID,
  readExportLines,
  replay,
  type ExportLine,
  type Harness,
  type HarnessOptions,
  snapshotFiles, harnessPool, syncThenCrashPublication } from './helpers.js';

const pool = harnessPool();
afterEach(() => pool.closeAll());

const FILE_RE = new RegExp(
  `^(messages|conversations|runs)/account=${ACCOUNT_ID}/date=(\\d{4}-\\d{2}-\\d{2})/(\\d{12})-(\\d{12})\\.jsonl$`,
);

const jsonlFiles = (dir: string) => new Map([...snapshotFiles(dir)].filter(([p]) => p.endsWith('.jsonl')));

const parseLines = (buf: Buffer): ExportLine[] =>
  buf
    .toString('utf8')
    .split('\n')
    .filter((l) => l !== '')
    .map((l) => JSON.parse(l) as ExportLine);

/** Virtual time from noon UTC of a fixed day (waits move it), so a test cannot straddle a date partition. */
const noonClock = () => testClock({ start: Date.UTC(2026, 0, 15, 12), sleep: 'advance' });

const maxSeq = (h: Harness) => topSeq(h.mirror);

/** Projection of a served message onto the fields of an export line. */
function messageFields(raw: Record<string, unknown>): Record<string, unknown> {
  const s = raw['sender'] as Record<string, unknown>;
  const out: Record<string, unknown> = {
    id: raw['id'],
    content: raw['content'],
    visibility: raw['visibility'],
    sender: { id: s['id'], name: s['name'], type: s['type'] },
  };
  if (raw['attachments'] !== undefined) out['attachments'] = raw['attachments'];
  out['created_at'] = raw['created_at'];
  return out;
}

/** Three syncs with inserts, edits, deletions, appends, a new and a deleted conversation in between. */
async function busyHistory(start: (opts: HarnessOptions) => Promise<Harness>): Promise<Harness> {
  const ws = FakeWorkspace.fromCounts([3, 150, 0, 20, 101, 7], 11);
  const h = await start({ workspace: ws });
  await h.sync({ full: true }); // full refresh: edits on early pages are part of this history
  const L = ws.list();
  const [c3, c150, c0, c20, c101, c7] = [L[0]!, L[1]!, L[2]!, L[3]!, L[4]!, L[5]!];
  ws.editMessage(c150.id, c150.messages[3]!.id, 'edited once');
  ws.editMessage(c101.id, c101.messages[100]!.id, 'edited: Grüße 👋');
  ws.deleteMessage(c150.id, c150.messages[0]!.id);
  ws.deleteMessage(c101.id, c101.messages[50]!.id);
  ws.appendMessages(c20.id, 5);
  ws.addConversation(12, 'front');
  ws.deleteConversation(c7.id);
  await h.sync({ full: true }); // full refresh: edits on early pages are part of this history
  ws.editMessage(c20.id, c20.messages[22]!.id, 'edited appended message');
  ws.editMessage(c150.id, c150.messages[2]!.id, 'edited twice');
  for (const m of c3.messages.slice()) ws.deleteMessage(c3.id, m.id);
  ws.appendMessages(c0.id, 2);
  ws.moveToFront(c101.id);
  await h.sync({ full: true }); // full refresh: edits on early pages are part of this history
  const eq = await mirrorMatchesFake(h.mirror, ws);
  expect(eq.ok, eq.detail).toBe(true);
  return h;
}

describe.each(engines)('$name', (engine) => {
  afterEach(() => engine.cleanup());
  const start = (opts: HarnessOptions): Promise<Harness> => pool.start({ ...opts, engine });

  describe('exports after a history of changes', () => {
    it('replaying every line by seq equals the live mirror, for messages and conversations', async () => {
      const h = await busyHistory(start);
      const ops = [...new Set((await changeRows(h.mirror)).map((c) => `${c.stream}:${c.op}`))].sort();
      // the history exercised every kind of change
      expect(ops).toEqual([
        'conversations:delete',
        'conversations:insert',
        'conversations:update',
        'messages:delete',
        'messages:insert',
        'messages:update',
        'runs:insert',
      ]);

      const msgs = replay(readExportLines(h.exportDir, 'messages'), 'messages');
      const live = (await records(h.mirror, 'messages')).filter((r) => r.deleted === 0);
      expect(new Set(msgs.keys())).toEqual(new Set(live.map((r) => `${r.account_id}/${r.conversation_id}/${r.id}`)));
      for (const r of live) {
        const line = msgs.get(`${r.account_id}/${r.conversation_id}/${r.id}`)!;
        const { seq, op, synced_at, account_id, conversation_id, ...fields } = line;
        expect(op).not.toBe('delete');
        expect(account_id).toBe(r.account_id);
        expect(conversation_id).toBe(r.conversation_id);
        expect(fields).toEqual(messageFields(JSON.parse(r.raw!)));
        expect(typeof seq).toBe('number');
        expect(typeof synced_at).toBe('string');
      }

      const convs = replay(readExportLines(h.exportDir, 'conversations'), 'conversations');
      const liveConvs = (await records(h.mirror, 'conversations')).filter((r) => r.deleted === 0);
      expect(new Set(convs.keys())).toEqual(new Set(liveConvs.map((r) => `${r.account_id}/${r.id}`)));
      for (const r of liveConvs) {
        expect(r.raw).not.toBeNull();
        expect(convs.get(`${r.account_id}/${r.id}`)!['data']).toEqual(JSON.parse(r.raw!));
      }
    });

    it('seq is strictly increasing in every file and covers the change log exactly once', async () => {
      const h = await busyHistory(start);
      const files = jsonlFiles(h.exportDir);
      const all: ExportLine[] = [];
      for (const [p, buf] of files) {
        const lines = parseLines(buf);
        expect(lines.length, p).toBeGreaterThan(0);
        for (let i = 1; i < lines.length; i++) expect(lines[i]!.seq, p).toBeGreaterThan(lines[i - 1]!.seq);
        all.push(...lines);
      }
      const seqs = all.map((l) => l.seq).sort((a, b) => a - b);
      const max = await maxSeq(h);
      expect(seqs).toEqual([...Array(max).keys()].map((i) => i + 1));
      // each line is the change-log row of its seq
      const rows = await changeRows(h.mirror);
      const bySeq = new Map(all.map((l) => [l.seq, l]));
      for (const r of rows) {
        const l = bySeq.get(r.seq)!;
        expect([l.op, l.id, 'conversation_id' in l ? 'messages' : 'scope' in l ? 'runs' : 'conversations']).toEqual([r.op, r.record_id, r.stream]);
      }
      expect((await h.mirror.counts()).export_watermark).toBe(max);
      expect((await h.mirror.counts()).unexported_changes).toBe(0);
    });

    it('files follow <stream>/account=<id>/date=YYYY-MM-DD/<first>-<last>.jsonl and lines have exactly the documented keys', async () => {
      const h = await busyHistory(start);
      const all = snapshotFiles(h.exportDir);
      const others = [...all.keys()].filter((p) => !p.endsWith('.jsonl'));
      expect(others.filter((p) => !/^_ledger\/\d{12}\.json$/.test(p))).toEqual([MANIFEST]);
      expect(others.length).toBe(1 + (await h.mirror.ledgerEntries()).length);
      let withAttachments = 0;
      let withoutAttachments = 0;
      const served = new Map<string, Record<string, unknown>>();
      for (const r of await records(h.mirror, 'messages')) {
        served.set(`${r.conversation_id}/${r.id}`, JSON.parse(r.raw!));
      }
      for (const [p, buf] of jsonlFiles(h.exportDir)) {
        const m = FILE_RE.exec(p);
        expect(m, p).not.toBeNull();
        const [, stream, date, first, last] = m!;
        const lines = parseLines(buf);
        // one compact JSON object per line, LF-terminated, nothing else
        expect(buf.toString('utf8')).toBe(lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
        expect(Number(first)).toBe(lines[0]!.seq);
        expect(Number(last)).toBe(lines.at(-1)!.seq);
        for (const l of lines) {
          expect(l.account_id).toBe(ACCOUNT_ID);
          expect(String(l['synced_at']).slice(0, 10)).toBe(date);
          expect(l['synced_at']).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/);
          expect(['insert', 'update', 'delete']).toContain(l.op);
          if (stream === 'messages') {
            const hasAtt = 'attachments' in l;
            const keys = ['seq', 'op', 'synced_at', 'account_id', 'conversation_id', 'id', 'content', 'visibility', 'sender', ...(hasAtt ? ['attachments'] : []), 'created_at'];
            expect(Object.keys(l)).toEqual(keys);
            expect(Object.keys(l['sender'] as object)).toEqual(['id', 'name', 'type']);
            // attachments present exactly when the API served the field
            const raw = served.get(`${l.conversation_id}/${l.id}`)!;
            expect(hasAtt).toBe('attachments' in raw);
            if (hasAtt) {
              withAttachments++;
              expect(l['attachments']).toEqual(raw['attachments']);
            } else withoutAttachments++;
          } else if (stream === 'runs') {
            expect(Object.keys(l).slice(0, 8)).toEqual(['seq', 'op', 'synced_at', 'account_id', 'id', 'scope', 'refresh', 'trigger']);
            expect(l['ended_at']).toBe(l['synced_at']);
            expect(Object.keys(l).at(-1)).toBe('ledger_head');
          } else {
            expect(Object.keys(l)).toEqual(['seq', 'op', 'synced_at', 'account_id', 'id', 'data']);
            expect((l['data'] as { id: string }).id).toBe(l.id);
          }
        }
      }
      expect(withAttachments).toBeGreaterThan(0);
      expect(withoutAttachments).toBeGreaterThan(0);
    });

    it('the batch records (version 2) list every file with its line count, size, sha256 and the Merkle root of its lines; manifest.json points at the head', async () => {
      const h = await busyHistory(start);
      const manifest = JSON.parse(fs.readFileSync(path.join(h.exportDir, MANIFEST), 'utf8')) as Manifest;
      expect(manifest.format).toBe('convo-mirror-exports');
      expect(manifest.version).toBe(3);
      expect(manifest.watermark).toBe(await maxSeq(h));
      expect(manifest.signed_at).toMatch(/^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{3}Z$/);
      expect(manifest.signature).toBeUndefined(); // no signing key
      expect(manifest.head).toEqual({ ...(await h.mirror.ledgerHead()), record: `_ledger/${String((await h.mirror.ledgerHead())!.batch_id).padStart(12, '0')}.json` });
      const files = jsonlFiles(h.exportDir);
      const listed = ledgerFiles(h.exportDir);
      expect(new Set(listed.map((f) => f.path))).toEqual(new Set(files.keys()));
      expect(listed.length).toBe(files.size);
      for (const f of listed) {
        const buf = files.get(f.path)!;
        expect(f.bytes).toBe(buf.length);
        expect(f.sha256).toBe(crypto.createHash('sha256').update(buf).digest('hex'));
        expect(f.merkle_root, f.path).toBe(linesMerkleRoot(buf));
        expect(Object.keys(f).slice(-2)).toEqual(['sha256', 'merkle_root']);
        expect(f.lines).toBe(parseLines(buf).length);
        expect(f.stream).toBe(f.path.split('/')[0]);
        expect(f.account_id).toBe(ACCOUNT_ID);
      }
      const versions = fs.readdirSync(path.join(h.exportDir, '_ledger')).map((n) => (JSON.parse(fs.readFileSync(path.join(h.exportDir, '_ledger', n), 'utf8')) as { version: number }).version);
      expect(versions.length).toBeGreaterThan(1);
      expect(new Set(versions)).toEqual(new Set([2]));
      const firsts = listed.map((f) => f.first_seq);
      expect(firsts).toEqual([...firsts].sort((a, b) => a - b));
      const recorded = (await h.mirror.publishedFiles()).map((f) => ({ path: f.path, lines: f.lines, bytes: f.bytes, sha256: f.sha256 })).sort((a, b) => (a.path < b.path ? -1 : 1));
      expect(recorded).toEqual(
        listed.map((f) => ({ path: f.path, lines: f.lines, bytes: f.bytes, sha256: f.sha256 })).sort((a, b) => (a.path < b.path ? -1 : 1)),
      );
    });
  });

  describe('verifyExports', () => {
    it('returns [] for intact exports and detects tampered, missing, unlisted and temp files', async () => {
      const ws = FakeWorkspace.fromCounts([30, 120]);
      const h = await start({ workspace: ws });
      await h.sync();
      expect(await verifyExports(h.mirror, h.exportDir)).toEqual([]);
      const [msgFile, convFile] = [...jsonlFiles(h.exportDir).keys()].sort((a, b) => (a.startsWith('messages') ? -1 : b.startsWith('messages') ? 1 : 0));
      expect(msgFile!.startsWith('messages/')).toBe(true);
      expect(convFile!.startsWith('conversations/')).toBe(true);

      // same size, one byte changed
      const abs = path.join(h.exportDir, msgFile!);
      const buf = fs.readFileSync(abs);
      const i = buf.indexOf('"content":"') + 11;
      buf[i] = buf[i] === 0x58 ? 0x59 : 0x58;
      fs.writeFileSync(abs, buf);
      const recorded = ledgerFiles(h.exportDir).find((f) => f.path === msgFile)!;
      const record = fs.readdirSync(path.join(h.exportDir, '_ledger')).find((n) => fs.readFileSync(path.join(h.exportDir, '_ledger', n), 'utf8').includes(msgFile!))!;
      expect(await verifyExports(h.mirror, h.exportDir)).toEqual([
        { path: msgFile, problem: 'sha256', found: crypto.createHash('sha256').update(buf).digest('hex'), expected: recorded.sha256 },
        {
          path: msgFile,
          problem: 'merkle_root',
          found: linesMerkleRoot(buf),
          expected: recorded.merkle_root,
          detail: `the Merkle tree hash of its ${recorded.lines} lines is not the one the record of batch ${Number(record.slice(0, 12))} (_ledger/${record}) commits to: a line was changed, added, removed or moved`,
        },
      ]);

      // a line dropped: size, sha256, lines and the root all differ
      const text = fs.readFileSync(abs, 'utf8').split('\n');
      fs.writeFileSync(abs, text.slice(1).join('\n'));
      const problems = (await verifyExports(h.mirror, h.exportDir)).map((p) => p.problem).sort();
      expect(problems).toEqual(['lines', 'merkle_root', 'sha256', 'size']);

      fs.rmSync(path.join(h.exportDir, convFile!));
      fs.writeFileSync(path.join(h.exportDir, path.dirname(convFile!), '000000000999-000000000999.jsonl'), '{}\n');
      fs.writeFileSync(path.join(h.exportDir, TEMP_DIR, 'messages-9-1.123.tmp'), 'partial');
      fs.writeFileSync(path.join(h.exportDir, '.x.jsonl.123.tmp'), 'not ours');
      const found = await verifyExports(h.mirror, h.exportDir);
      expect(found).toContainEqual({ path: convFile, problem: 'missing' });
      expect(found).toContainEqual({ path: `${path.dirname(convFile!)}/000000000999-000000000999.jsonl`, problem: 'unlisted' });
      expect(found).toContainEqual(expect.objectContaining({ path: `${TEMP_DIR}/messages-9-1.123.tmp`, problem: 'temp' }));
      // a file outside the mirror's partition trees and temp dir is someone else's business
      expect(found.map((p) => p.path)).not.toContain('.x.jsonl.123.tmp');
    });
  });

  describe('publishChanges', () => {
    /**
     * Syncs what changed without publishing, then publishes up to the `before-record` failpoint (data
     * files, batch record and manifest written and fsynced, nothing recorded in SQLite: a crash
     * there), and removes the batch's files and record again so that a re-publication must rebuild
     * them from the mirror. Returns the batch and the bytes it had published.
     */
    async function interruptPublication(h: Harness): Promise<{ batch: { id: number; first_seq: number; last_seq: number }; files: Map<string, Buffer>; record: Buffer }> {
      const batch = await syncThenCrashPublication(h);
      // Unpublished: every change of the batch keeps its payload; everything published before has none.
      const changes = await changeRows(h.mirror);
      expect(changes.filter((c) => c.seq >= batch.first_seq && c.seq <= batch.last_seq && c.record !== null)).toHaveLength(batch.last_seq - batch.first_seq + 1);
      expect(changes.filter((c) => c.seq < batch.first_seq && c.record !== null)).toEqual([]);
      const recordRel = `_ledger/${String(batch.id).padStart(12, '0')}.json`;
      const record = fs.readFileSync(path.join(h.exportDir, recordRel));
      const paths = (JSON.parse(record.toString('utf8')) as { files: { path: string }[] }).files.map((f) => f.path);
      expect(paths.length).toBeGreaterThan(0);
      const files = new Map(paths.map((p) => [p, fs.readFileSync(path.join(h.exportDir, p))]));
      for (const p of [...paths, recordRel]) fs.rmSync(path.join(h.exportDir, p));
      return { batch, files, record };
    }

    it('re-publishing a planned but unpublished batch gives the same file names and bytes, and no duplicate line', async () => {
      const ws = FakeWorkspace.fromCounts([40, 130, 2]);
      const h = await start({ workspace: ws });
      await h.sync();
      const c = ws.list()[1]!;
      ws.editMessage(c.id, c.messages[7]!.id, 'changed');
      ws.deleteMessage(c.id, c.messages[9]!.id);
      ws.appendMessages(c.id, 3);
      const firstBatchFiles = jsonlFiles(h.exportDir);
      const { batch, files, record } = await interruptPublication(h);

      const res = await publishChanges(h.mirror, { exportDir: h.exportDir });
      expect(res.resumed).toBe(true);
      expect(res.watermark).toBe(await maxSeq(h));
      const again1 = res.files.filter((f) => f.batch_id === batch.id);
      expect(again1.map((f) => f.path).sort()).toEqual([...files.keys()].sort());
      expect(again1.reduce((n, f) => n + f.lines, 0)).toBe([...files.values()].reduce((n, b) => n + parseLines(b).length, 0));
      for (const [p, bytes] of files) expect(fs.readFileSync(path.join(h.exportDir, p)).equals(bytes), p).toBe(true);
      // the earlier batch's files are untouched, the batch record is byte-identical
      for (const [p, bytes] of firstBatchFiles) expect(fs.readFileSync(path.join(h.exportDir, p)).equals(bytes)).toBe(true);
      expect(fs.readFileSync(path.join(h.exportDir, `_ledger/${String(batch.id).padStart(12, '0')}.json`)).equals(record)).toBe(true);
      expect(jsonlFiles(h.exportDir).size).toBe(firstBatchFiles.size + res.files.length);

      const seqs = [...readExportLines(h.exportDir, 'messages'), ...readExportLines(h.exportDir, 'conversations'), ...readExportLines(h.exportDir, 'runs')].map((l) => l.seq);
      expect(new Set(seqs).size).toBe(seqs.length);
      expect(seqs.length).toBe(await maxSeq(h));
      expect(await verifyExports(h.mirror, h.exportDir)).toEqual([]);
      expect(await h.mirror.pendingExportBatch()).toBeUndefined();
      // recorded: the payloads are pruned, the change-log rows stay
      const after = await changeRows(h.mirror);
      expect(after.filter((c) => c.record !== null)).toEqual([]);
      expect(after).toHaveLength(await maxSeq(h));

      // and a further call has nothing to do
      const again = await publishChanges(h.mirror, { exportDir: h.exportDir });
      expect(again).toMatchObject({ files: [], lines: 0, watermark: await maxSeq(h), resumed: false });
    });

    it('the run after an interrupted publication exports both the interrupted batch and its own changes', async () => {
      const ws = FakeWorkspace.fromCounts([40, 130]);
      const h = await start({ workspace: ws });
      await h.sync();
      ws.appendMessages(ws.list()[1]!.id, 2);
      const { files } = await interruptPublication(h);
      const c = ws.list()[0]!;
      ws.editMessage(c.id, c.messages[1]!.id, 'changed after the crash');
      const s = await h.sync();
      expect(s.export.resumed).toBe(true);
      for (const [p, bytes] of files) expect(fs.readFileSync(path.join(h.exportDir, p)).equals(bytes), p).toBe(true);
      // nothing the run committed is left unexported (its own line came after its changes)
      expect(s.export.watermark).toBe((await maxSeq(h)) - 1);
      expect((await h.mirror.counts()).unexported_changes).toBe(0);
      const live = replay(readExportLines(h.exportDir, 'messages'), 'messages');
      expect(live.get(`${ACCOUNT_ID}/${c.id}/${c.messages[1]!.id}`)!['content']).toBe('changed after the crash');
      expect(await verifyExports(h.mirror, h.exportDir)).toEqual([]);
    });

    it('the next publish removes its own leftover temp files, and only those', async () => {
      const ws = FakeWorkspace.fromCounts([5, 6]);
      const h = await start({ workspace: ws });
      await h.sync();
      const dataFile = [...jsonlFiles(h.exportDir).keys()][0]!;
      const ours = [path.join(h.exportDir, TEMP_DIR, 'messages-1-1.999.tmp'), path.join(h.exportDir, TEMP_DIR, `${MANIFEST}.999.tmp`)];
      fs.writeFileSync(ours[0]!, '{"seq":1,"op":"ins');
      fs.writeFileSync(ours[1]!, '{');
      // Files named like temp files but not in .convo-mirror-tmp/ belong to someone else: kept.
      const tmpInPartition = path.join(h.exportDir, path.dirname(dataFile), '.x.jsonl.123.tmp');
      const tmpAtRoot = path.join(h.exportDir, `.${MANIFEST}.999.tmp`);
      fs.writeFileSync(tmpInPartition, '{"seq":1,"op":"ins');
      fs.writeFileSync(tmpAtRoot, '{');
      const inPartition = { path: `${path.dirname(dataFile)}/.x.jsonl.123.tmp`, problem: 'unlisted' };
      expect((await verifyExports(h.mirror, h.exportDir)).map((p) => ({ path: p.path, problem: p.problem }))).toEqual([
        inPartition,
        { path: `${TEMP_DIR}/${MANIFEST}.999.tmp`, problem: 'temp' },
        { path: `${TEMP_DIR}/messages-1-1.999.tmp`, problem: 'temp' },
      ]);
      const before = jsonlFiles(h.exportDir);
      const res = await publishChanges(h.mirror, { exportDir: h.exportDir });
      expect(res.files).toEqual([]);
      for (const f of ours) expect(fs.existsSync(f), f).toBe(false);
      expect(fs.readFileSync(tmpInPartition, 'utf8')).toBe('{"seq":1,"op":"ins');
      expect(fs.readFileSync(tmpAtRoot, 'utf8')).toBe('{');
      expect(jsonlFiles(h.exportDir)).toEqual(before);
      expect(await verifyExports(h.mirror, h.exportDir)).toEqual([inPartition]);
    });

    it('with nothing pending publishes zero files and changes nothing but the time of the signed head', async () => {
      const ws = FakeWorkspace.fromCounts([5, 6]);
      const clock = noonClock();
      const h = await start({ workspace: ws, clock });
      const s = await h.sync();
      const snapshot = snapshotFiles(h.exportDir);
      // What the ledger holds (and, SQLite only, every column of every batch: no method lists the batches).
      const ledger = async () => ({
        entries: await h.mirror.ledgerEntries(),
        files: await h.mirror.publishedFiles(),
        pending: await h.mirror.pendingExportBatch(),
        watermark: await h.mirror.exportWatermark(),
        batches: engine.name === 'sqlite' ? sqlAll(h.mirror, `SELECT * FROM export_batches`) : undefined,
      });
      const batches = await ledger();
      clock.advance(3_600_000);
      const res = await publishChanges(h.mirror, { exportDir: h.exportDir, clock });
      expect(res).toEqual({ files: [], lines: 0, watermark: await maxSeq(h), resumed: false, head: s.export.head, held: 0 });
      expect(s.export.watermark).toBe((await maxSeq(h)) - 1); // the run's own line was published after its changes
      const after = snapshotFiles(h.exportDir);
      const before = JSON.parse(snapshot.get(MANIFEST)!.toString('utf8')) as Manifest;
      // The head is re-signed now: same head and watermark, a fresh time.
      expect(JSON.parse(after.get(MANIFEST)!.toString('utf8'))).toEqual({ ...before, signed_at: new Date(clock.now()).toISOString() });
      after.delete(MANIFEST);
      snapshot.delete(MANIFEST);
      expect(after).toEqual(snapshot);
      expect(await ledger()).toEqual(batches);
    });

    it('with nothing ever synced publishes zero files', async () => {
      const h = await start({ workspace: FakeWorkspace.fromCounts([]) });
      const clock = noonClock();
      const res = await publishChanges(h.mirror, { exportDir: h.exportDir, clock });
      expect(res).toEqual({ files: [], lines: 0, watermark: 0, resumed: false, head: undefined, held: 0 });
      expect(jsonlFiles(h.exportDir).size).toBe(0);
      const manifest = JSON.parse(fs.readFileSync(path.join(h.exportDir, MANIFEST), 'utf8')) as Manifest;
      expect(manifest).toEqual({ format: 'convo-mirror-exports', version: 3, mirror_id: await h.mirror.mirrorId(), watermark: 0, ledger: '_ledger', head: null, signed_at: '2026-01-15T12:00:00.000Z' });
      expect(await h.mirror.mirrorId()).toMatch(/^[0-9a-f]{32}$/);
    });

    it('splits a partition into files of at most maxLinesPerFile lines, named by their seq range', async () => {
      const ws = FakeWorkspace.fromCounts([120, 45]);
      const h = await start({ workspace: ws, clock: noonClock() });
      await syncWorkspace({ ...h.deps }, { accountId: ACCOUNT_ID, runId: null, concurrency: 4 });
      const res = await publishChanges(h.mirror, { exportDir: h.exportDir, maxLinesPerFile: 50 });
      expect(res.files.every((f) => f.date === '2026-01-15')).toBe(true);
      expect(res.lines).toBe(2 + 165);
      const files = jsonlFiles(h.exportDir);
      expect(files.size).toBe(res.files.length);
      const msgFiles = res.files.filter((f) => f.stream === 'messages');
      expect(msgFiles.map((f) => f.lines)).toEqual([50, 50, 50, 15]);
      for (const f of res.files) {
        const lines = parseLines(files.get(f.path)!);
        expect(lines.length).toBe(f.lines);
        expect(lines.length).toBeLessThanOrEqual(50);
        expect(f.path).toMatch(FILE_RE);
        expect(path.basename(f.path)).toBe(`${String(lines[0]!.seq).padStart(12, '0')}-${String(lines.at(-1)!.seq).padStart(12, '0')}.jsonl`);
      }
      const seqs = [...readExportLines(h.exportDir, 'messages'), ...readExportLines(h.exportDir, 'conversations')].map((l) => l.seq).sort((a, b) => a - b);
      expect(seqs).toEqual([...Array(167).keys()].map((i) => i + 1));
      expect(await verifyExports(h.mirror, h.exportDir)).toEqual([]);
    });
  });

  describe('one export directory per mirror', () => {
    it('a recreated mirror refuses an export directory written by another, and no published byte changes', async () => {
      const ws = FakeWorkspace.fromCounts([30, 4]);
      const h = await start({ workspace: ws });
      await h.sync();
      const before = jsonlFiles(h.exportDir);
      expect(before.size).toBeGreaterThan(0);
      // A fresh mirror (its seq restarts at 1) pointed at the same export directory.
      const other = await engine.open();
      try {
        await syncWorkspace({ ...h.deps, mirror: other }, { accountId: ACCOUNT_ID, runId: null });
        await expect(publishChanges(other, { exportDir: h.exportDir })).rejects.toThrowError(/holds the exports of another mirror/);
      } finally {
        await other.close();
      }
      const after = jsonlFiles(h.exportDir);
      expect([...after.keys()]).toEqual([...before.keys()]);
      for (const [k, v] of before) expect(after.get(k)!.equals(v), k).toBe(true);
    });

    it('never replaces a published file with different bytes, even without a manifest', async () => {
      const ws = FakeWorkspace.fromCounts([30]);
      const h = await start({ workspace: ws });
      await h.sync();
      // A batch published up to the `before-record` failpoint (a crash before SQLite recorded it), so
      // the next publication plans it again while a different file now sits at one of its names.
      ws.appendMessages(ws.list()[0]!.id, 3);
      const batch = await syncThenCrashPublication(h);
      const record = JSON.parse(fs.readFileSync(path.join(h.exportDir, `_ledger/${String(batch.id).padStart(12, '0')}.json`), 'utf8')) as { files: { path: string }[] };
      const rel = record.files.map((f) => f.path).find((p) => p.startsWith('messages/'))!;
      const bytes = fs.readFileSync(path.join(h.exportDir, rel));
      fs.rmSync(path.join(h.exportDir, MANIFEST));
      fs.rmSync(path.join(h.exportDir, rel));
      fs.writeFileSync(path.join(h.exportDir, rel), 'not what the mirror would write\n');
      await expect(publishChanges(h.mirror, { exportDir: h.exportDir })).rejects.toThrowError(/refusing to replace the published export file/);
      expect(fs.readFileSync(path.join(h.exportDir, rel), 'utf8')).toBe('not what the mirror would write\n');
      expect(bytes.length).toBeGreaterThan(0);
      // The watermark did not move.
      expect((await h.mirror.counts()).export_watermark).toBe(batch.first_seq - 1);
    });
  });

  describe('replay after a sync of named conversations', () => {
    it('the conversation row created by a named sync has an export line, so replay still equals the mirror', async () => {
      const ws = FakeWorkspace.fromCounts([12, 3]);
      const h = await start({ workspace: ws });
      const target = ws.list()[0]!;
      await h.sync({ conversationIds: [target.id] });
      const convLines = readExportLines(h.exportDir, 'conversations');
      expect(convLines.map((l) => [l.op, l.id, l['data']])).toEqual([['insert', target.id, { id: target.id }]]);
      const live = await h.mirror.liveConversationIds(ACCOUNT_ID);
      expect([...replay(convLines, 'conversations').keys()]).toEqual(live.map((id) => `${ACCOUNT_ID}/${id}`));
      // A later full sync replaces the placeholder with the object as served: an update line.
      await h.sync();
      const after = readExportLines(h.exportDir, 'conversations').filter((l) => l.id === target.id);
      expect(after.map((l) => l.op)).toEqual(['insert', 'update']);
      expect(after[1]!['data']).toEqual(target.data);
      const eq = await mirrorMatchesFake(h.mirror, ws);
      expect(eq.ok, eq.detail).toBe(true);
    });
  });
});
