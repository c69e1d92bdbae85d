/**
 * `manifest.json`: a small pointer to the head of the ledger's hash chain, rewritten (atomically)
 * at each publication. It lists no files: the batch records in `_ledger/` do, and they are the
 * evidence. Consumers read it to find the head and the watermark; `verify` checks it against the
 * chain it walked (and the mirror's records when the database is there).
 *
 * Version 1 manifests (before the ledger) listed every file and were rewritten whole at every
 * publication; an export directory holding one is migrated by its next publication (see
 * `publishChanges`).
 */
import type { LedgerHead } from '../store/mirror.js';
import { recordPath } from './ledger.js';

/** The manifest document (`manifest.json`), version 2. */
export interface Manifest {
  format: 'convo-mirror-exports';
  version: 2;
  /** Id of the mirror whose change log these files hold (`mirror_meta.mirror_id`). */
  mirror_id: string;
  /** Last change_log.seq published. */
  watermark: number;
  /** Directory of the batch records. */
  ledger: '_ledger';
  /** The chain head: the last batch record published, and its file; null before the first. */
  head: (LedgerHead & { record: string }) | null;
}

/** The manifest for a chain head and watermark. */
export function manifestOf(mirrorId: string, head: LedgerHead | undefined, watermark: number): Manifest {
  return {
    format: 'convo-mirror-exports',
    version: 2,
    mirror_id: mirrorId,
    watermark,
    ledger: '_ledger',
    head: head ? { batch_id: head.batch_id, hash: head.hash, record: recordPath(head.batch_id) } : null,
  };
}

/** The exact bytes of `manifest.json`: JSON indented by 2, LF-terminated, UTF-8. */
export function renderManifest(manifest: Manifest): Buffer {
  return Buffer.from(JSON.stringify(manifest, null, 2) + '\n', 'utf8');
}
