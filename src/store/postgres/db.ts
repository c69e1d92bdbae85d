import type pg from 'pg';

/** Anything that runs a query: the pool or a client inside a transaction. */
export type Queryable = Pick<pg.ClientBase, 'query'>;

/** Quotes the mirror's schema name (validated identifier) for SQL text. */
export function qualify(schema: string, table: string): string {
  return `"${schema}"."${table}"`;
}
