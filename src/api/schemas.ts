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
 * Validates a parsed body against a page schema.
 *
 * @param what - human label for errors, e.g. `conversation 1b2c... messages page 3`
 * @throws {@link SchemaError} naming `what` and the first offending field path (e.g. `data[4].sender.type`)
 */
export function parsePage<T>(
  schema: z.ZodType<{ data: T[]; meta: Meta }>,
  body: unknown,
  page: number,
  what: string,
  context: Record<string, unknown>,
): Page<T> {
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
