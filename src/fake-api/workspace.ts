/**
 * The fake API's data: a seeded, deterministic, mutable workspace of conversations and messages
 * (fake-api/). {@link startFakeApi} serves it; tests mutate it mid-crawl.
 *
 * Determinism: every id, name, text and timestamp comes from one {@link mulberry32} stream seeded at
 * construction, and timestamps come from a logical clock that starts at {@link BASE_TIME_MS}. Nothing
 * reads `Date.now()`. The same seed and the same sequence of calls give byte-identical JSON.
 */
import { chance, mulberry32, pick, randHex, randInt, randUuidV4, shuffle, type Rng } from './prng.js';

/** Author of a message, as embedded in it (spec 2.2). `type` is `Customer` or `User` here. */
export interface FakeSender {
  /** Sender identifier, e.g. `cus_3f0a…` for a customer or `usr_91bc…` for a team member. */
  id: string;
  /** Display name; may contain non-ASCII letters and quotes. */
  name: string;
  /** `Customer` (the conversation's contact) or `User` (a team member). */
  type: string;
}

/**
 * A message exactly as served by `GET /v1/conversations/:id/messages` (spec 2.1).
 *
 * Key order in the JSON is `id, content, visibility, sender, attachments?, created_at`. `attachments`
 * is absent (about 50 %), `[]` (about 25 %) or 1–3 objects
 * `{id: number, file_type, file_name, file_size, data_url}` (about 25 %; `file_size` in bytes).
 */
export interface FakeMessage {
  /** `msg_` + 16 lowercase hex digits, unique across the workspace (including deleted messages). */
  id: string;
  /** Text; may be empty (rarely, only with attachments), multi-line, non-ASCII, or ~20 KB long. */
  content: string;
  /** `global` (public) or `personal` (internal note, always from a `User`); about 15 % personal. */
  visibility: string;
  /** The author (spec 2.2). */
  sender: FakeSender;
  /** May be absent; may be `[]`. Element shape is not in the spec; see the interface description. */
  attachments?: unknown[];
  /** ISO 8601 UTC with milliseconds, e.g. `2025-01-02T03:04:05.678Z`; strictly increasing within a conversation. */
  created_at: string;
  /** Room for fields the spec does not list. The generator adds none. */
  [extra: string]: unknown;
}

/** One conversation: its list entry and its chronological messages. */
export interface FakeConversation {
  /** UUID v4 (spec 2.4); equals `data.id`. */
  id: string;
  /**
   * The object served for this conversation by `GET /v1/conversations` (spec 4.2; shape not in the
   * spec, so plausible): `{id, status: 'open'|'pending'|'resolved', inbox_id: number,
   * contact: {id, name}, created_at, last_activity_at, messages_count}`. `last_activity_at` and
   * `messages_count` are kept current by the workspace's mutation methods.
   */
  data: Record<string, unknown>;
  /** Messages in chronological order (what the messages endpoint pages through). Treat as read-only. */
  messages: FakeMessage[];
}

/** Options of {@link FakeWorkspace.generate}. */
export interface GenerateOptions {
  /** PRNG seed; truncated to an unsigned 32-bit integer. Same seed ⇒ same workspace. */
  seed: number;
  /** Number of conversations, an integer `>= 0`. */
  conversations: number;
}

/** Start of the generated timeline: 2025-01-01T00:00:00.000Z, in ms since the epoch. */
export const BASE_TIME_MS = Date.UTC(2025, 0, 1);

const DAY_MS = 86_400_000;

const FIRST_NAMES = [
  'Alice', 'Bob', 'José', 'Zoë', 'Søren', 'Ólafur', 'Chloé', 'Jürgen', 'Siobhán', 'Marta',
  'Wei', 'Yuki', 'Priya', 'Ahmed', 'Fatima', 'Noam', 'Ngozi', 'Mateo', 'Ana', 'Dmitri',
  '李伟', '山田', 'محمد', 'נועה', 'Олег', 'Björk', 'Nguyễn', 'Kwame', 'Élodie', 'Seán',
] as const;
const LAST_NAMES = [
  'Smith', "O'Brien", 'García', 'Müller', 'Nakamura', 'Kowalski', 'Dubois', 'Haddad', 'Cohen',
  'Okafor', 'Silva', 'Ivanova', 'Thị Minh', 'Zhang', 'Jónsdóttir', 'Van der Berg', 'Lefèvre',
  'Al-Farsi', 'Ruiz-Tagle', 'Døssing',
] as const;
const AGENT_NAMES = [
  'Sam (Support)', 'Dana Lee', 'Renée Martin', 'Kenji Watanabe', 'Amara Obi', 'Luis Peña',
  'Support Bot 🤖', 'Ingrid Åberg',
] as const;

const CUSTOMER_LINES = [
  'Hi, my order hasn\'t arrived yet.',
  'Hello! I was charged twice for the same subscription.',
  'Can you help me reset my password?',
  'The app crashes when I open the settings page.',
  'I\'d like a refund for order #48213, please.',
  'Is there a way to export my data as CSV?',
  'Thanks, that worked!',
  'Still not working, sorry.',
  'He said "it\'s broken" and left. The file is at C:\\Users\\me\\Desktop\\invoice.pdf',
  'Why does the page show <b>bold</b> & <script>alert(1)</script> text?',
  'Coupon code 100% OFF; DROP TABLE messages;-- does not apply',
  'ok',
  '?',
  'Tab\tseparated\tvalues\there',
  'Any update on this?',
  'My account email changed from a@example.com to b+test@example.org',
] as const;
const AGENT_LINES = [
  'Thanks for reaching out! Let me look into this for you.',
  'I\'ve issued a refund; it should appear within 5–7 business days.',
  'Could you send me a screenshot of the error?',
  'We\'ve escalated this to our engineering team.',
  'Your password reset link has been sent.',
  'Glad I could help — is there anything else?',
  'I\'m closing this conversation now. Reply any time to reopen it.',
  'Sorry for the wait! We\'re seeing higher volume than usual.',
] as const;
const NOTE_LINES = [
  'Internal: customer is on the legacy plan, check billing history first.',
  'Looks like a duplicate of the ticket from last week.',
  '@Dana can you take this one? I\'m off tomorrow.',
  'Refund approved by finance.',
  'Note to self: do NOT promise an ETA.',
  'Repro steps confirmed on iOS 17.4.',
] as const;
const UNICODE_LINES = [
  'Café crème, naïve façade — déjà vu. Straße, Øresund, Ærøskøbing.',
  '您好，我的订单还没有到。请帮我查一下，谢谢！',
  'ご注文番号を確認してください。よろしくお願いします。',
  '안녕하세요, 환불 요청드립니다.',
  'مرحبا، أحتاج إلى مساعدة في طلبي رقم ١٢٣٤٥',
  'שלום, ההזמנה שלי לא הגיעה עדיין',
  'Привет! Не могу войти в аккаунт.',
  'Γειά σου κόσμε — ελληνικά',
  'Mixed: order ١٢٣ / 注文 456 / שלום 789',
  'Combining marks: e\u0301 a\u0308 n\u0303 (decomposed)',
  'Math: ∑ x² ≤ ∞, π ≈ 3.14159, 1/2 = ½',
] as const;
const EMOJI = [
  '👍', '🎉', '😀', '🙏', '❤️', '😡', '🔥', '✅', '👋🏽', '👩‍💻', '👨‍👩‍👧‍👦', '🏳️‍🌈', '🧑🏿‍🚀',
  '🇫🇷', '🇯🇵', '🤷‍♀️', '1️⃣',
] as const;
const FILE_TYPES = [
  ['image', 'png'],
  ['image', 'jpg'],
  ['file', 'pdf'],
  ['file', 'csv'],
  ['audio', 'mp3'],
  ['video', 'mp4'],
] as const;
const FILE_STEMS = ['screenshot', 'invoice', 'Rechnung', 'log export', 'photo_2025', '截图', 'voice note'] as const;
const STATUSES = ['open', 'pending', 'resolved'] as const;

/**
 * A seeded, mutable fake workspace: the conversations `GET /v1/conversations` lists (spec 4.2) and the
 * messages `GET /v1/conversations/:id/messages` pages through (spec 4.1).
 *
 * Create one with {@link FakeWorkspace.generate} or {@link FakeWorkspace.fromCounts}. Mutations draw
 * ids, texts and timestamps from the same PRNG stream, so they are deterministic too. New timestamps
 * come from a logical clock that is always later than every timestamp already in the workspace.
 */
export class FakeWorkspace {
  /** The seed the workspace was created with (after `>>> 0`). */
  readonly seed: number;
  private readonly rng: Rng;
  private convs: FakeConversation[] = [];
  private readonly byId = new Map<string, FakeConversation>();
  private readonly contacts = new Map<string, { id: string; name: string }>();
  private readonly messageIds = new Set<string>();
  private readonly agents: { id: string; name: string }[];
  private clockMs = BASE_TIME_MS;
  private attachmentSeq = 0;

  private constructor(seed: number) {
    this.seed = seed >>> 0;
    this.rng = mulberry32(this.seed);
    this.agents = AGENT_NAMES.map((name) => ({ id: `usr_${randHex(this.rng, 12)}`, name }));
  }

  /**
   * A realistic workspace with heavy-tailed message counts.
   *
   * Per-conversation message counts: when `conversations >= 20`, one each of exactly 99, 100, 101,
   * 200 and 250; when `conversations >= 50`, one of exactly 1,200 plus `floor(conversations / 150) - 1`
   * more spread over 1,001–2,000. The rest: 43 % with 0–5, 25 % with 6–40, 22 % with 41–300 and
   * 10 % with 301–900 messages, each group spread evenly over its range (with jitter) so totals
   * hardly depend on the seed. That averages about 105–115 messages per conversation (300
   * conversations ≈ 34,000 messages; seed 42 / 320 ≈ 36,000; 2,000 ≈ 226,000). The list is ordered by `last_activity_at`,
   * newest first.
   *
   * @throws RangeError when `conversations` is not an integer `>= 0`
   */
  static generate(opts: GenerateOptions): FakeWorkspace {
    const n = opts.conversations;
    if (!Number.isInteger(n) || n < 0) throw new RangeError(`generate: conversations must be an integer >= 0, got ${n}`);
    const ws = new FakeWorkspace(opts.seed);
    const counts = ws.planCounts(n);
    for (const count of counts) {
      const createdMs = BASE_TIME_MS + Math.floor(ws.rng() * 200 * DAY_MS);
      ws.convs.push(ws.buildConversation(count, createdMs, ws.initialGap));
    }
    ws.convs.sort((a, b) => {
      const la = a.data['last_activity_at'] as string;
      const lb = b.data['last_activity_at'] as string;
      return la < lb ? 1 : la > lb ? -1 : a.id < b.id ? -1 : a.id > b.id ? 1 : 0;
    });
    return ws;
  }

  /**
   * A workspace with one conversation per entry of `counts`, holding exactly that many messages, in
   * that list order (for pagination tests). Contents are generated as in {@link FakeWorkspace.generate}.
   *
   * @param counts - message count per conversation, each an integer `>= 0`
   * @param seed - PRNG seed. @defaultValue 1
   * @throws RangeError when a count is not an integer `>= 0`
   */
  static fromCounts(counts: number[], seed = 1): FakeWorkspace {
    for (const c of counts) {
      if (!Number.isInteger(c) || c < 0) throw new RangeError(`fromCounts: counts must be integers >= 0, got ${c}`);
    }
    const ws = new FakeWorkspace(seed);
    for (const count of counts) {
      ws.convs.push(ws.buildConversation(count, ws.tick(), ws.appendGap));
    }
    return ws;
  }

  /**
   * The conversations in current list order, i.e. the order `GET /v1/conversations` pages through.
   * A new array each call (reordering it does not affect the workspace); the conversation objects
   * themselves are live.
   */
  list(): FakeConversation[] {
    return this.convs.slice();
  }

  /** The live conversation with this id, or `undefined` if there is none (or it was deleted). */
  get(id: string): FakeConversation | undefined {
    return this.byId.get(id);
  }

  /** Current number of conversations and of messages across them. */
  totals(): { conversations: number; messages: number } {
    let messages = 0;
    for (const c of this.convs) messages += c.messages.length;
    return { conversations: this.convs.length, messages };
  }

  /**
   * Appends `n` new messages at the end of a conversation. Their `created_at` values are strictly
   * increasing and later than every timestamp in the workspace. Updates `messages_count` and
   * `last_activity_at`. Does not move the conversation in the list (see {@link FakeWorkspace.moveToFront}).
   *
   * @param n - how many, an integer `>= 0`
   * @returns the new messages (live objects, also in `get(conversationId).messages`)
   * @throws Error when the conversation does not exist; RangeError when `n` is not an integer `>= 0`
   */
  appendMessages(conversationId: string, n: number): FakeMessage[] {
    const conv = this.mustGet(conversationId);
    if (!Number.isInteger(n) || n < 0) throw new RangeError(`appendMessages: n must be an integer >= 0, got ${n}`);
    const contact = this.contacts.get(conv.id) as { id: string; name: string };
    const added: FakeMessage[] = [];
    for (let i = 0; i < n; i++) {
      const m = this.makeMessage(contact, this.tick());
      conv.messages.push(m);
      added.push(m);
    }
    if (n > 0) this.touch(conv, this.clockMs);
    return added;
  }

  /**
   * Removes one message. Updates `messages_count` and advances `last_activity_at` to a new clock tick
   * (a plausible change signal). The id is never reused.
   *
   * @throws Error when the conversation or the message does not exist
   */
  deleteMessage(conversationId: string, messageId: string): void {
    const conv = this.mustGet(conversationId);
    const idx = conv.messages.findIndex((m) => m.id === messageId);
    if (idx < 0) throw new Error(`deleteMessage: no message ${messageId} in conversation ${conversationId}`);
    conv.messages.splice(idx, 1);
    this.touch(conv, this.tick());
  }

  /**
   * Replaces a message's `content` in place (its `id`, `created_at` and position are unchanged) and
   * advances the conversation's `last_activity_at` to a new clock tick.
   *
   * @throws Error when the conversation or the message does not exist
   */
  editMessage(conversationId: string, messageId: string, content: string): void {
    const conv = this.mustGet(conversationId);
    const msg = conv.messages.find((m) => m.id === messageId);
    if (!msg) throw new Error(`editMessage: no message ${messageId} in conversation ${conversationId}`);
    msg.content = content;
    this.touch(conv, this.tick());
  }

  /**
   * Creates a conversation with `messageCount` messages, all later than anything already in the
   * workspace, and inserts it into the list.
   *
   * @param messageCount - an integer `>= 0`
   * @param where - `'front'` (page 1 of the list) or `'back'` (the last page). @defaultValue 'front'
   * @returns the new live conversation
   * @throws RangeError when `messageCount` is not an integer `>= 0`
   */
  addConversation(messageCount: number, where: 'front' | 'back' = 'front'): FakeConversation {
    if (!Number.isInteger(messageCount) || messageCount < 0) {
      throw new RangeError(`addConversation: messageCount must be an integer >= 0, got ${messageCount}`);
    }
    const conv = this.buildConversation(messageCount, this.tick(), this.appendGap);
    if (where === 'front') this.convs.unshift(conv);
    else this.convs.push(conv);
    return conv;
  }

  /**
   * Removes a conversation: it disappears from the list, {@link FakeWorkspace.get} returns
   * `undefined`, and its messages endpoint answers 404.
   *
   * @throws Error when the conversation does not exist
   */
  deleteConversation(id: string): void {
    const conv = this.mustGet(id);
    this.byId.delete(id);
    this.contacts.delete(id);
    this.convs = this.convs.filter((c) => c !== conv);
  }

  /**
   * Moves a conversation to the first position of the list (a busy conversation jumps to page 1).
   * Only the order changes; its data and messages are untouched.
   *
   * @throws Error when the conversation does not exist
   */
  moveToFront(id: string): void {
    const conv = this.mustGet(id);
    this.convs = [conv, ...this.convs.filter((c) => c !== conv)];
  }

  /** Reverses the list order. */
  reverse(): void {
    this.convs.reverse();
  }

  /**
   * Puts back a conversation removed by {@link FakeWorkspace.deleteConversation}, unchanged (same
   * id, data and messages): a conversation that was gone for a while and came back.
   *
   * @param conv - the object `get(id)` returned before the deletion
   * @param where - `'front'` or `'back'` of the list. @defaultValue 'front'
   * @throws Error when a conversation with that id exists
   */
  restoreConversation(conv: FakeConversation, where: 'front' | 'back' = 'front'): void {
    if (this.byId.has(conv.id)) throw new Error(`restoreConversation: conversation ${conv.id} exists`);
    this.byId.set(conv.id, conv);
    const sender = conv.messages.find((m) => m.sender.type === 'Customer')?.sender;
    this.contacts.set(conv.id, sender ? { id: sender.id, name: sender.name } : { id: `cus_${conv.id.slice(0, 8)}`, name: 'Restored Contact' });
    if (where === 'front') this.convs.unshift(conv);
    else this.convs.push(conv);
  }

  // ---- internals ----------------------------------------------------------------------------

  private mustGet(id: string): FakeConversation {
    const conv = this.byId.get(id);
    if (!conv) throw new Error(`no conversation ${id}`);
    return conv;
  }

  /** Advances the logical clock by a small random step and returns the new time (ms). */
  private tick(): number {
    this.clockMs += randInt(this.rng, 1_000, 90_000);
    return this.clockMs;
  }

  private touch(conv: FakeConversation, atMs: number): void {
    conv.data['last_activity_at'] = new Date(atMs).toISOString();
    conv.data['messages_count'] = conv.messages.length;
  }

  /** Gap between consecutive generated messages, ms: mostly seconds to minutes, sometimes days. */
  private readonly initialGap = (): number => {
    const r = this.rng();
    if (r < 0.6) return randInt(this.rng, 5_000, 300_000);
    if (r < 0.9) return randInt(this.rng, 300_000, 7_200_000);
    return randInt(this.rng, 7_200_000, 2 * DAY_MS);
  };

  /** Gap for messages created after generation (added conversations): 1 s to 90 s. */
  private readonly appendGap = (): number => randInt(this.rng, 1_000, 90_000);

  private planCounts(n: number): number[] {
    const rng = this.rng;
    const counts: number[] = [];
    // k values spread evenly over [lo, hi] with jitter (stratified), so totals barely vary by seed.
    const spread = (k: number, lo: number, hi: number): void => {
      for (let i = 0; i < k; i++) counts.push(lo + Math.floor(((i + rng()) / k) * (hi - lo + 1)));
    };
    if (n >= 20) counts.push(99, 100, 101, 200, 250);
    if (n >= 50) {
      counts.push(1200);
      spread(Math.floor(n / 150) - 1, 1001, 2000);
    }
    const rest = n - counts.length;
    const large = Math.round(rest * 0.1);
    const mid = Math.round(rest * 0.22);
    const small = Math.round(rest * 0.25);
    spread(rest - large - mid - small, 0, 5);
    spread(small, 6, 40);
    spread(mid, 41, 300);
    spread(large, 301, 900);
    return shuffle(rng, counts);
  }

  private personName(): string {
    return `${pick(this.rng, FIRST_NAMES)} ${pick(this.rng, LAST_NAMES)}`;
  }

  private buildConversation(count: number, createdMs: number, gap: () => number): FakeConversation {
    const rng = this.rng;
    let id = randUuidV4(rng);
    while (this.byId.has(id)) id = randUuidV4(rng);
    const contact = { id: `cus_${randHex(rng, 12)}`, name: this.personName() };
    const data: Record<string, unknown> = {
      id,
      status: pick(rng, STATUSES),
      inbox_id: randInt(rng, 1, 4),
      contact: { id: contact.id, name: contact.name },
      created_at: new Date(createdMs).toISOString(),
      last_activity_at: '',
      messages_count: 0,
    };
    const messages: FakeMessage[] = [];
    let t = createdMs;
    for (let i = 0; i < count; i++) {
      if (i > 0) t += gap();
      messages.push(this.makeMessage(contact, t));
    }
    if (t > this.clockMs) this.clockMs = t;
    const conv: FakeConversation = { id, data, messages };
    this.touch(conv, t);
    this.byId.set(id, conv);
    this.contacts.set(id, contact);
    return conv;
  }

  private newMessageId(): string {
    let id = `msg_${randHex(this.rng, 16)}`;
    while (this.messageIds.has(id)) id = `msg_${randHex(this.rng, 16)}`;
    this.messageIds.add(id);
    return id;
  }

  private makeMessage(contact: { id: string; name: string }, atMs: number): FakeMessage {
    const rng = this.rng;
    const id = this.newMessageId();
    const r = rng();
    let visibility: string;
    let sender: FakeSender;
    if (r < 0.15) {
      visibility = 'personal';
      const a = pick(rng, this.agents);
      sender = { id: a.id, name: a.name, type: 'User' };
    } else if (r < 0.15 + 0.85 * 0.6) {
      visibility = 'global';
      sender = { id: contact.id, name: contact.name, type: 'Customer' };
    } else {
      visibility = 'global';
      const a = pick(rng, this.agents);
      sender = { id: a.id, name: a.name, type: 'User' };
    }
    const ar = rng();
    const attachments: unknown[] | undefined = ar < 0.5 ? undefined : ar < 0.75 ? [] : this.makeAttachments();
    const content =
      attachments !== undefined && attachments.length > 0 && chance(rng, 0.02)
        ? ''
        : this.makeContent(visibility === 'personal' ? NOTE_LINES : sender.type === 'Customer' ? CUSTOMER_LINES : AGENT_LINES);
    const created_at = new Date(atMs).toISOString();
    // Keep the documented key order: attachments (when present) before created_at.
    return attachments === undefined
      ? { id, content, visibility, sender, created_at }
      : { id, content, visibility, sender, attachments, created_at };
  }

  private makeAttachments(): unknown[] {
    const rng = this.rng;
    const n = randInt(rng, 1, 3);
    const out: unknown[] = [];
    for (let i = 0; i < n; i++) {
      const [fileType, ext] = pick(rng, FILE_TYPES);
      const id = ++this.attachmentSeq;
      const fileName = `${pick(rng, FILE_STEMS)}-${randInt(rng, 1, 999)}.${ext}`;
      out.push({
        id,
        file_type: fileType,
        file_name: fileName,
        file_size: randInt(rng, 120, 8_000_000),
        data_url: `https://files.example.com/attachments/${id}/${encodeURIComponent(fileName)}`,
      });
    }
    return out;
  }

  private makeContent(lines: readonly string[]): string {
    const rng = this.rng;
    const r = rng();
    if (r < 0.002) return this.longContent();
    if (r < 0.12) {
      const k = randInt(rng, 2, 6);
      const parts: string[] = [];
      for (let i = 0; i < k; i++) {
        const p = rng();
        parts.push(p < 0.2 ? '' : p < 0.4 ? `- ${pick(rng, lines)}` : p < 0.6 ? pick(rng, UNICODE_LINES) : pick(rng, lines));
      }
      return parts.join('\n') + (chance(rng, 0.1) ? '\n' : '');
    }
    let text = pick(rng, lines);
    const u = rng();
    if (u < 0.2) text = pick(rng, UNICODE_LINES);
    else if (u < 0.3) text = `${text} ${pick(rng, UNICODE_LINES)}`;
    if (chance(rng, 0.15)) text = `${text} ${pick(rng, EMOJI)}`;
    if (chance(rng, 0.02)) text = pick(rng, EMOJI);
    return text;
  }

  /** About 20 KB (at least 20,000–22,000 UTF-16 code units) of numbered mixed-script lines; never splits a character. */
  private longContent(): string {
    const rng = this.rng;
    const target = 20_000 + randInt(rng, 0, 2_000);
    const parts: string[] = [];
    let len = 0;
    for (let i = 1; len < target; i++) {
      const p = `${i}. ${pick(rng, CUSTOMER_LINES)} ${pick(rng, UNICODE_LINES)} ${pick(rng, EMOJI)}`;
      parts.push(p);
      len += p.length + 1;
    }
    return parts.join('\n');
  }
}
