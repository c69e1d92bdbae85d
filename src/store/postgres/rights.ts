/**
 * The rights a role needs on a PostgreSQL mirror, without node-postgres: `check` names them
 * whichever engine the process otherwise loads.
 */

/** The privileges on every table of its schema a role needs to write a PostgreSQL mirror. */
export const WRITER_TABLE_PRIVILEGES = ['SELECT', 'INSERT', 'UPDATE', 'DELETE'] as const;
