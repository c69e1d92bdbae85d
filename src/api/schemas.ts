/**
 * zod schemas of the documented responses (spec 2.1-2.3, 4.1) and of our assumption about
 * `GET /v1/conversations` (spec 4.2: shape not shown; we assume the same `{data, meta}` envelope
 * with conversation objects carrying at least `id`).
 *
 * Strict where the spec is precise, open where it says "not shown": `visibility` and `sender.type`
 * accept any string, unknown fields are kept, `attachments` may be absent.
 */
import { z } from 'zod';
import { SchemaError } from '../errors.js';

/** Spec 2.2: the sender embedded in a message. */
export const SenderSchema = z.looseObject({
  id: z.string(),
  name: z.string(),
  /** Values seen: `Customer`, `User`; complete set not shown, so any string. */
  type: z.string(),
});

/** Spec 2.1: a message. */
export const MessageSchema = z.looseObject({
  id: z.string().min(1),
  content: z.string(),
  /** Values seen: `global`, `personal`; complete set not shown, so any string. */
  visibility: z.string(),
  sender: SenderSchema,
  /** May be absent or empty; element shape not shown. */
  attachments: z.array(z.unknown()).optional(),
  /** ISO 8601 UTC timestamp. */
  created_at: z.iso.datetime({ offset: true }),
});

/** Spec 2.3: pagination metadata. */
export const MetaSchema = z.looseObject({
  current_page: z.number().int().min(0),
  total_pages: z.number().int().min(0),
  total_count: z.number().int().min(0),
});

/** Spec 4.1: `GET /v1/conversations/:id/messages` response. */
export const MessagesPageSchema = z.looseObject({ data: z.array(MessageSchema), meta: MetaSchema });

/** Assumed (spec 4.2: not shown): a conversation carries at least a string `id`. */
export const ConversationSchema = z.looseObject({ id: z.string().min(1) });

/** Assumed (spec 4.2: not shown): `GET /v1/conversations` uses the `{data, meta}` envelope. */
export const ConversationsPageSchema = z.looseObject({ data: z.array(ConversationSchema), meta: MetaSchema });

export type Message = z.infer<typeof MessageSchema>;
export type Meta = z.infer<typeof MetaSchema>;
export type Conversation = z.infer<typeof ConversationSchema>;

/** A validated page: typed records plus each record's raw object exactly as served. */
/** Records per page for every list request: the documented maximum (spec 4.1, 8). */
export const PER_PAGE = 100;

export interface Page<T> {
  /** The page number that was requested (1-based). */
  page: number;
  /** Validated records, in served order. */
  data: T[];
  /** Each record's served JSON object (unknown fields included), index-aligned with `data`. */
  raw: Record<string, unknown>[];
  meta: Meta;
}

/**
 * Deepest nesting accepted in a record, in levels: the record object is level 1, each object or
 * array inside it one more (`{"attachments": [{}]}` is 3 levels). JSON nested far deeper parses fine
 * but later overflows the stack of every recursive consumer (`JSON.stringify`, SQLite JSON
 * functions, exporters), so {@link parsePage} refuses it. Envelope fields other than `data` (e.g.
 * `meta`) are held to the same limit, counted from the envelope's child.
 */
export const MAX_JSON_DEPTH = 64;

/**
 * The path (e.g. `data[3].attachments[0][0]`) of the first object or array nested deeper than
 * `maxDepth` levels in `value`, or `undefined`. `value` itself is level `rootDepth` (1 for a record;
 * 0 for an array of records, so each record is level 1). Iterative: no recursion, so it is safe on
 * any nesting depth, and it stops as soon as the limit is crossed. The common case (not too deep)
 * allocates nothing per container; the path is worked out only on failure.
 */
export function tooDeep(value: unknown, rootPath: string, maxDepth = MAX_JSON_DEPTH, rootDepth = 1): string | undefined {
  if (value === null || typeof value !== 'object') return undefined;
  const values: object[] = [value];
  const depths: number[] = [rootDepth];
  while (values.length > 0) {
    const v = values.pop()!;
    const depth = depths.pop()! + 1;
    if (Array.isArray(v)) {
      for (let i = 0; i < v.length; i++) {
        const child: unknown = v[i];
        if (child === null || typeof child !== 'object') continue;
        if (depth > maxDepth) return deepPath(value, rootPath, maxDepth, rootDepth);
        values.push(child);
        depths.push(depth);
      }
    } else {
      for (const k in v) {
        const child: unknown = (v as Record<string, unknown>)[k];
        if (child === null || typeof child !== 'object') continue;
        if (depth > maxDepth) return deepPath(value, rootPath, maxDepth, rootDepth);
        values.push(child);
        depths.push(depth);
      }
    }
  }
  return undefined;
}

/** A container on the walk of {@link deepPath}; parents link back to build the path. */
interface Frame {
  value: object;
  depth: number;
  parent: Frame | undefined;
  key: string | number;
}

/**
 * The path of the first container deeper than `maxDepth` in `root` (known to exist), found by the
 * same walk as {@link tooDeep} but remembering parents. Only runs when a page is refused.
 */
function deepPath(root: object, rootPath: string, maxDepth: number, rootDepth: number): string {
  const stack: Frame[] = [{ value: root, depth: rootDepth, parent: undefined, key: rootPath }];
  for (let frame = stack.pop(); frame !== undefined; frame = stack.pop()) {
    const v = frame.value as Record<string, unknown>;
    const keys: (string | number)[] = Array.isArray(v) ? v.map((_, i) => i) : Object.keys(v);
    for (const k of keys) {
      const child: unknown = v[k];
      if (child === null || typeof child !== 'object') continue;
      const f: Frame = { value: child, depth: frame.depth + 1, parent: frame, key: k };
      if (f.depth > maxDepth) return framePath(f);
      stack.push(f);
    }
  }
  return rootPath;
}

function framePath(f: Frame): string {
  const keys: (string | number)[] = [];
  for (let x: Frame | undefined = f; x; x = x.parent) keys.push(x.key);
  let out = '';
  for (let i = keys.length - 1; i >= 0; i--) {
    const k = keys[i]!;
    out += typeof k === 'number' ? `[${k}]` : out === '' ? k : `.${k}`;
  }
  return out;
}

/**
 * Most JSON values one response may hold before it is parsed: a page is at most 100 records of a
 * few dozen values each, so 250,000 leaves a hundredfold margin while keeping the parsed objects
 * of one response to tens of MB. Without it, a 3 MB body of a million `{}` parses into gigabytes.
 */
export const MAX_JSON_VALUES = 250_000;

/**
 * Counts the JSON values in `buf` without parsing it: every `{`, `[` and `,` outside strings
 * starts a value (plus the first). Stops counting once past `limit`. Linear, no allocation.
 *
 * @returns the count, or `limit + 1` as soon as it exceeds `limit`
 */
export function countJsonValues(buf: Uint8Array, limit = MAX_JSON_VALUES): number {
  let n = 1;
  let inString = false;
  for (let i = 0; i < buf.length; i++) {
    const c = buf[i]!;
    if (inString) {
      if (c === 0x5c) i++; // backslash: skip the escaped byte
      else if (c === 0x22) inString = false;
    } else if (c === 0x22) inString = true;
    else if (c === 0x7b || c === 0x5b || c === 0x2c) {
      if (++n > limit) return n;
    }
  }
  return n;
}

/**
 * Validates a parsed body against a page schema. First checks, iteratively, that no record (and no
 * other envelope field) nests deeper than {@link MAX_JSON_DEPTH} levels.
 *
 * @param what - human label for errors, e.g. `conversation 1b2c... messages page 3`
 * @throws {@link SchemaError} naming `what` and the first offending field path (e.g. `data[4].sender.type`,
 *   or for nesting `data[0].attachments[0][0]…`)
 */
export function parsePage<T>(
  schema: z.ZodType<{ data: T[]; meta: Meta }>,
  body: unknown,
  page: number,
  what: string,
  context: Record<string, unknown>,
): Page<T> {
  if (body !== null && typeof body === 'object' && !Array.isArray(body)) {
    for (const key in body) {
      const value = (body as Record<string, unknown>)[key];
      // Records (the elements of `data`) are level 1; so is any other envelope field.
      const deep = key === 'data' && Array.isArray(value) ? tooDeep(value, 'data', MAX_JSON_DEPTH, 0) : tooDeep(value, key);
      if (deep !== undefined) {
        throw new SchemaError(
          `${what}: JSON nested deeper than ${MAX_JSON_DEPTH} levels at ${deep} (a record this deep cannot be stored or exported)`,
          { ...context, field: deep, max_depth: MAX_JSON_DEPTH },
        );
      }
    }
  }
  const result = schema.safeParse(body);
  if (!result.success) {
    const issue = result.error.issues[0];
    const field = issue ? formatPath(issue.path) : '(root)';
    throw new SchemaError(`${what}: response does not match the documented shape at ${field}: ${issue?.message ?? 'invalid'}`, {
      ...context,
      field,
    });
  }
  const rawData = (body as { data: Record<string, unknown>[] }).data;
  return { page, data: result.data.data, raw: rawData, meta: result.data.meta };
}

function formatPath(path: readonly PropertyKey[]): string {
  let out = '';
  for (const p of path) out += typeof p === 'number' ? `[${p}]` : out === '' ? String(p) : `.${String(p)}`;
  return out === '' ? '(root)' : out;
}
