/**
 * The fake API (fake-api/): a seeded, mutable workspace ({@link FakeWorkspace}) served over real
 * HTTP ({@link startFakeApi}) with fault injection, for tests and the demo. Implements the API-key
 * endpoints of spec sections 4, 5 and 8 exactly; see `server.ts` for the endpoint rules and `workspace.ts` for the data.
 */
export { mulberry32, randInt, pick, chance, randHex, randUuidV4, shuffle, type Rng } from './prng.js';
export {
  FakeWorkspace,
  BASE_TIME_MS,
  type FakeSender,
  type FakeMessage,
  type FakeConversation,
  type GenerateOptions,
} from './workspace.js';
export {
  startFakeApi,
  MIN_HUGE_BYTES,
  type RequestRecord,
  type Fault,
  type FaultMatch,
  type FakeApiOptions,
  type FakeTenant,
  type FakeApi,
} from './server.js';
