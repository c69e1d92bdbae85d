/**
 * The export manifest: what the mirror's records imply, its exact bytes, and how an on-disk manifest
 * differs from it. Publication writes {@link renderManifest}'s bytes; `verify` compares the file with
 * the same bytes, so one function decides both.
 */
import type { Mirror, PublishedFile } from '../store/mirror.js';

/** One published file, as recorded in `export_files` and the manifest. */
export type ExportFile = PublishedFile;

/** The manifest document (`manifest.json`). */
export interface Manifest {
  format: 'convo-mirror-exports';
  version: 1;
  /** Id of the mirror whose change log these files hold (`mirror_meta.mirror_id`). */
  mirror_id: string;
  /** Last change_log.seq contained in the listed files. */
  watermark: number;
  /** Every published file, in seq order of first line. */
  files: ExportFile[];
}

/** The fields of a manifest entry, in the order they are written. */
const FILE_FIELDS = ['path', 'stream', 'account_id', 'date', 'first_seq', 'last_seq', 'lines', 'bytes', 'sha256', 'batch_id'] as const;
/** The top-level fields of a manifest, in the order they are written. */
const TOP_FIELDS = ['format', 'version', 'mirror_id', 'watermark', 'files'] as const;

/**
 * The manifest the mirror's records imply: every file of `export_files`, plus `extra` (files of the
 * batch being published, not recorded yet; same path wins), sorted by first seq then path.
 *
 * @param watermark - the watermark to write: the exported watermark, or the last seq of the batch
 *   being published
 */
export function manifestOf(mirror: Mirror, mirrorId: string, extra: ExportFile[], watermark: number): Manifest {
  const known = mirror.publishedFiles();
  const byPath = new Map<string, ExportFile>();
  for (const f of known) byPath.set(f.path, entry(f));
  for (const f of extra) byPath.set(f.path, entry(f));
  const files = [...byPath.values()].sort((a, b) => a.first_seq - b.first_seq || (a.path < b.path ? -1 : a.path > b.path ? 1 : 0));
  return { format: 'convo-mirror-exports', version: 1, mirror_id: mirrorId, watermark, files };
}

/** A manifest entry with its fields in the written order, whatever the source object's order. */
function entry(f: ExportFile): ExportFile {
  const out: Record<string, unknown> = {};
  for (const k of FILE_FIELDS) out[k] = f[k];
  return out as unknown as ExportFile;
}

/**
 * The manifest the mirror's records imply now: recorded files and the exported watermark. This is
 * what `manifest.json` must hold whenever no publication is in progress.
 */
export function recordedManifest(mirror: Mirror): Manifest {
  return manifestOf(mirror, mirror.mirrorId(), [], mirror.exportWatermark());
}

/** The exact bytes of `manifest.json`: JSON indented by 2, LF-terminated, UTF-8. */
export function renderManifest(manifest: Manifest): Buffer {
  return Buffer.from(JSON.stringify(manifest, null, 2) + '\n', 'utf8');
}

const show = (v: unknown): string => (v === undefined ? 'absent' : JSON.stringify(v));
const isObject = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);

/**
 * The first difference between an on-disk manifest (`actual`, parsed JSON) and the one the mirror
 * implies, in one line: `watermark 120, the mirror says 130`, `mirror_id "…", the mirror says "…"`,
 * `files[3].sha256 differs for messages/…/x.jsonl: "…", the mirror says "…"`,
 * `files[7] missing: the mirror lists messages/…`, `files[7] not recorded by the mirror: …`,
 * `unexpected field "x"`, or, when the content is the same but the bytes are not,
 * `same content, different bytes from byte N (formatting)`.
 *
 * @param actualBytes - the file's bytes, for the formatting-only case
 */
export function manifestDifference(expected: Manifest, actual: unknown, actualBytes: Buffer): string {
  if (!isObject(actual)) return `not a JSON object (${Array.isArray(actual) ? 'an array' : show(actual)})`;
  const exp = expected as unknown as Record<string, unknown>;
  for (const k of TOP_FIELDS) {
    if (k === 'files') continue;
    if (actual[k] !== exp[k]) return `${k} ${show(actual[k])}, the mirror says ${show(exp[k])}`;
  }
  const files = actual['files'];
  if (!Array.isArray(files)) return `files ${files === undefined ? 'absent' : 'is not an array'}, the mirror lists ${expected.files.length} files`;
  for (let i = 0; i < Math.max(files.length, expected.files.length); i++) {
    const want = expected.files[i];
    const got: unknown = files[i];
    if (want === undefined) return `files[${i}] not recorded by the mirror: ${isObject(got) ? show(got['path']) : show(got)}`;
    if (got === undefined) return `files[${i}] missing: the mirror lists ${want.path} (${expected.files.length} files, the manifest ${files.length})`;
    if (!isObject(got)) return `files[${i}] is not an object, the mirror lists ${want.path}`;
    if (got['path'] !== want.path) return `files[${i}].path ${show(got['path'])}, the mirror says ${show(want.path)}`;
    for (const f of FILE_FIELDS) {
      if (got[f] !== want[f]) return `files[${i}].${f} differs for ${want.path}: ${show(got[f])}, the mirror says ${show(want[f])}`;
    }
    const extraKey = Object.keys(got).find((k) => !(FILE_FIELDS as readonly string[]).includes(k));
    if (extraKey !== undefined) return `files[${i}] has an unexpected field ${show(extraKey)} (${want.path})`;
  }
  const extraTop = Object.keys(actual).find((k) => !(TOP_FIELDS as readonly string[]).includes(k));
  if (extraTop !== undefined) return `unexpected field ${show(extraTop)}`;
  const wanted = renderManifest(expected);
  let at = 0;
  while (at < wanted.length && at < actualBytes.length && wanted[at] === actualBytes[at]) at++;
  return `same content, different bytes from byte ${at} (formatting)`;
}
