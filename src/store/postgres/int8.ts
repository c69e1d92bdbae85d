/**
 * node-postgres returns `bigint` (int8) and `numeric` values as strings, since they may exceed
 * 2^53. The ledger's numbers (seqs, ids, counts, figures) are JS numbers in the store's interface,
 * as SQLite gives them: queries of the runs, ledger, audit and status groups pass {@link NUMBERS}
 * as their `types`, so an int8 comes back a number (per query: nothing global is changed).
 */
import pg from 'pg';
import { StoreError } from '../../errors.js';

/** Parses an int8's text; throws rather than round a value above 2^53. */
function parseInt8(text: string): number {
  const n = Number(text);
  if (!Number.isSafeInteger(n)) throw new StoreError(`a PostgreSQL bigint (${text}) exceeds what a JS number holds exactly (2^53)`, { value: text });
  return n;
}

/** Type parsers for one query: int8 (OID 20) as a number, every other type as pg parses it. */
export const NUMBERS: pg.CustomTypesConfig = {
  getTypeParser: ((oid: number, format?: string) =>
    oid === 20 && format !== 'binary' ? parseInt8 : pg.types.getTypeParser(oid, format as 'text')) as pg.CustomTypesConfig['getTypeParser'],
};
