"""The tests' Postgres databases: each test its own copy of the migrated template, made cheaply.

A `CREATE DATABASE ... TEMPLATE` (it copies every file of the template, and checkpoints before
and after) and the `DROP DATABASE` after the test cost the server about 320 ms of CPU, measured
on two cores, for each of about 1,500 tests. So a copy a test is done with is given back here,
and made like a new copy again for the next test of the same process: its other sessions ended
(as `DROP DATABASE ... WITH (FORCE)` ended them), the tables it wrote truncated with their
sequences restarted, its statistics counters reset (`pg_stat_reset`), and renamed, so that a
process the test left running cannot reach the next test's rows by the URL it had. About 60 ms.

A test may change more than rows: create a table, ANALYZE (statistics the planner reads), set
a table's or the database's settings, downgrade the schema, advance a sequence it never wrote a
row with. So a copy is taken back only when, once emptied, its catalogs say what a new copy's
say (`_STATE`: the schema, every setting, the planner's statistics, the sequences, the rows of
the tables the template already had rows in); otherwise it is dropped and the next test gets a
new copy. A test never sees another's rows, counters or changes.
"""

from __future__ import annotations

import contextlib
from typing import Any

import psycopg

from tests.services import PostgresServer

__all__ = ["TemplateCopies"]

#: Namespaces of the system, not of the template's schema.
_SYSTEM = "n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg\\_%'"

#: What a copy of the template holds besides rows, as one digest per part: a copy whose parts
#: differ from a new copy's once emptied is not taken back. `%(kept)s` becomes the digests of the
#: rows of the tables a new copy already has rows in (`alembic_version`).
_STATE = f"""
SELECT
  (SELECT md5(concat_ws('|', datallowconn, datconnlimit, datistemplate, datcollate, datctype,
          datacl::text)) FROM pg_database WHERE datname = current_database()),
  (SELECT md5(coalesce(string_agg(setrole::text || ':' || setconfig::text, ',' ORDER BY setrole),
          '')) FROM pg_db_role_setting s JOIN pg_database d ON d.oid = s.setdatabase
          WHERE d.datname = current_database()),
  (SELECT md5(string_agg(concat_ws('|', n.nspname, n.nspacl::text), ',' ORDER BY n.nspname))
     FROM pg_namespace n WHERE {_SYSTEM} OR n.nspname = 'public'),
  (SELECT md5(string_agg(concat_ws('|', n.nspname, c.relname, c.relkind, c.relpersistence,
          c.reloptions::text, c.relacl::text, c.relpages, c.reltuples, c.relallvisible,
          c.relhasindex, c.relrowsecurity, c.relreplident, c.relispartition, c.reltoastrelid <> 0),
          ',' ORDER BY n.nspname, c.relname))
     FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_SYSTEM}),
  (SELECT md5(string_agg(concat_ws('|', a.attrelid::regclass::text, a.attnum, a.attname,
          a.atttypid, a.atttypmod, a.attnotnull, a.attisdropped, a.attstattarget,
          a.attoptions::text, a.attidentity, a.attgenerated, a.attcollation,
          pg_get_expr(d.adbin, d.adrelid)), ',' ORDER BY a.attrelid::regclass::text, a.attnum))
     FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
     JOIN pg_namespace n ON n.oid = c.relnamespace
     LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
     WHERE {_SYSTEM} AND a.attnum > 0),
  (SELECT md5(coalesce(string_agg(concat_ws('|', c.conrelid::regclass::text, c.conname,
          c.condeferrable, c.condeferred, c.convalidated, pg_get_constraintdef(c.oid)), ','
          ORDER BY c.conrelid::regclass::text, c.conname), ''))
     FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace WHERE {_SYSTEM}),
  (SELECT md5(coalesce(string_agg(concat_ws('|', pg_get_indexdef(i.indexrelid), i.indisvalid,
          i.indisready, i.indislive, i.indisclustered, i.indisreplident), ',' ORDER BY
          pg_get_indexdef(i.indexrelid)), ''))
     FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
     JOIN pg_namespace n ON n.oid = c.relnamespace WHERE {_SYSTEM}),
  (SELECT md5(coalesce(string_agg(concat_ws('|', pg_get_triggerdef(t.oid), t.tgenabled), ','
          ORDER BY t.tgrelid::regclass::text, t.tgname), ''))
     FROM pg_trigger t WHERE NOT t.tgisinternal),
  (SELECT md5(coalesce(string_agg(concat_ws('|', n.nspname, p.proname, p.oid::regprocedure::text,
          md5(p.prosrc), p.proconfig::text), ',' ORDER BY p.oid::regprocedure::text), ''))
     FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace WHERE {_SYSTEM}),
  (SELECT md5(coalesce(string_agg(concat_ws('|', n.nspname, t.typname, t.typtype), ','
          ORDER BY n.nspname, t.typname), ''))
     FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace WHERE {_SYSTEM}),
  (SELECT md5(coalesce(string_agg(concat_ws('|', ev_class::regclass::text, rulename,
          ev_enabled, md5(ev_action::text)), ',' ORDER BY ev_class::regclass::text, rulename),
          '')) FROM pg_rewrite WHERE ev_class >= 16384),
  (SELECT md5(coalesce(string_agg(concat_ws('|', schemaname, sequencename, start_value,
          min_value, max_value, increment_by, cycle, cache_size, last_value), ','
          ORDER BY schemaname, sequencename), '')) FROM pg_sequences),
  (SELECT md5(coalesce(string_agg(concat_ws('|', e.extname, e.extversion), ',' ORDER BY
          e.extname), '')) FROM pg_extension e),
  (SELECT count(*) FROM pg_statistic WHERE starelid >= 16384),
  (SELECT count(*) FROM pg_statistic_ext_data),
  (SELECT count(*) FROM pg_policy), (SELECT count(*) FROM pg_event_trigger),
  (SELECT count(*) FROM pg_publication), (SELECT count(*) FROM pg_largeobject_metadata),
  (SELECT count(*) FROM pg_description WHERE objoid >= 16384),
  (SELECT count(*) FROM pg_default_acl), (SELECT count(*) FROM pg_prepared_xacts
     WHERE database = current_database()),
  %(kept)s
"""

#: The tables of the template's schemas, with whether the heap has any page.
_TABLES = f"""
SELECT format('%I.%I', n.nspname, c.relname), pg_relation_size(c.oid) > 0
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE c.relkind IN ('r', 'p') AND {_SYSTEM}
 ORDER BY 1
"""

#: The planner's figures of each index of the template's schemas, as a new copy has them.
_INDEXES = f"""
SELECT c.oid, c.relpages, c.reltuples, c.relallvisible
  FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE {_SYSTEM}
"""

#: A TRUNCATE leaves an index of the table with relpages 0 and reltuples -1 (unknown), where a
#: new copy's (built by CREATE INDEX on the empty table) has 1 and 0; the planner reads them to
#: size a partial index. Set back as a new copy has them, for the indexes of every table that
#: is again as new (empty, never vacuumed nor analyzed); the catalog's update invalidates the
#: figures any session cached. `%(values)s` becomes the new copy's rows.
_RESTORE = """
UPDATE pg_class c SET relpages = v.relpages, reltuples = v.reltuples,
       relallvisible = v.relallvisible
  FROM (VALUES %(values)s) AS v(oid, relpages, reltuples, relallvisible), pg_index i, pg_class h
 WHERE c.oid = v.oid AND i.indexrelid = c.oid AND h.oid = i.indrelid
   AND h.relpages = 0 AND h.reltuples = -1
   AND (c.relpages, c.reltuples, c.relallvisible)
       IS DISTINCT FROM (v.relpages, v.reltuples, v.relallvisible)
"""

_OTHERS = """
SELECT pg_terminate_backend(pid, 10000) FROM pg_stat_activity
 WHERE datname = current_database() AND pid <> pg_backend_pid()
"""


class TemplateCopies:
    """Copies of the database `template`, one for each test that `take`s one, `give_back`
    when it is done: taken back emptied, or dropped (see the module's docstring)."""

    def __init__(self, server: PostgresServer, template: str) -> None:
        self._server = server
        self.template = template
        self._clean: list[str] = []
        self._kept: list[str] | None = None  # the tables a new copy has rows in
        self._restore = ""  # sets the indexes' figures back (`_RESTORE`)
        self._state: tuple[Any, ...] | None = None  # what a new copy's catalogs say
        #: Copies taken back, and dropped, since the start: what the tests of a run made.
        self.reused = 0
        self.dropped = 0

    def take(self) -> str:
        """The name of a copy of the template for one test, as a new copy is."""
        if self._clean:
            return self._clean.pop()
        name = self._server.create_database(template=self.template)
        if self._state is None:
            with self._server.connect(name) as conn:
                self._kept = [table for table, written in conn.execute(_TABLES) if written]
                values = ", ".join(
                    f"({oid}::oid, {pages}::integer, {tuples}::real, {visible}::integer)"
                    for oid, pages, tuples, visible in conn.execute(_INDEXES)
                )
                self._restore = _RESTORE.replace("%(values)s", values) if values else ""
                self._state = self._read_state(conn)
                _reset_counters(conn)
        return name

    def give_back(self, name: str) -> None:
        """The test is done with `name`: empty it for a later test, or drop it."""
        try:
            if self._empty(name):
                # Under a new name: a process the test left running cannot connect to the
                # next test's database by the URL it was given, as after a DROP DATABASE.
                self._clean.append(self._server.rename_database(name))
                self.reused += 1
                return
        except psycopg.Error:
            pass  # the server went away, or a session connected again: dropped
        self.dropped += 1
        self._server.drop_database(name)

    def close(self) -> None:
        """Drop the copies kept for later tests."""
        while self._clean:
            with contextlib.suppress(psycopg.Error):
                self._server.drop_database(self._clean.pop())

    def _empty(self, name: str) -> bool:
        """Empty `name` as a new copy is: True when it then is one."""
        with self._server.connect(name) as conn:
            conn.execute(_OTHERS)
            if conn.execute(_OTHERS.replace("pg_terminate_backend(pid, 10000)", "1")).fetchone():
                return False  # a session that outlived ten seconds of asking it to end
            kept = set(self._kept or ())
            written = [table for table, pages in conn.execute(_TABLES) if pages]
            emptied = [table for table in written if table not in kept]
            if emptied:
                conn.execute(f"TRUNCATE {', '.join(emptied)} RESTART IDENTITY CASCADE")  # type: ignore[arg-type]
                if self._restore:
                    conn.execute(self._restore)  # type: ignore[arg-type]
            as_new = self._read_state(conn) == self._state
            _reset_counters(conn)
            return as_new

    def _read_state(self, conn: psycopg.Connection[tuple[Any, ...]]) -> tuple[Any, ...]:
        kept = self._kept or []
        digests = ", ".join(
            f"(SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM {table} t)"
            for table in kept
        )
        row = conn.execute(_STATE.replace("%(kept)s", digests or "''")).fetchone()  # type: ignore[arg-type]
        assert row is not None
        return tuple(row)


def _reset_counters(conn: psycopg.Connection[tuple[Any, ...]]) -> None:
    """Zero the statistics counters of the database (`pg_stat_user_tables`...), as a new copy
    has them: those of this session's own reads too, sent before the reset, not after it."""
    conn.execute("SELECT pg_stat_force_next_flush()")
    conn.execute("SELECT pg_stat_reset()")
