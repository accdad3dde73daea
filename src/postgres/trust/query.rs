//! The one query that judges a table whole: see [`super`].

/// Every part of a table that can run code as whoever plans, reads or deletes from it, with
/// its owner. `$1` the table (quoted), `$2` whether pgoutbox would write to it. The table
/// and each descendant through `pg_inherits` (partitions and inheritance children,
/// recursively); for each, its owner, its schema's owner (`public`'s `pg_database_owner` is
/// the database's owner), and everything its own objects reference through `pg_depend`,
/// followed from object to object: its indexes and their operator classes, extended
/// statistics, partition key and column types (`pg_depend` rows of the table itself),
/// constraints, generated columns (`pg_attrdef`; a virtual one runs at every read) and, with
/// `$2`, defaults (which run only on an insert), policies, rules (`pg_rewrite`)
/// and enabled triggers (`pg_trigger`, the WHEN expression included), to every function,
/// operator (and its `oprcode`, `oprrest`, `oprjoin`), type (and its domain constraints) and
/// operator class or family (and the operators and functions of the family). With `$2`, its
/// `ON DELETE` rules too. Each row: kind (`table`, `partition`, `child`, `schema`,
/// `function`, `operator`, `type`, `operator class`, `operator family`, `delete rule`), name,
/// what references it (`index … on …`; the relation for a delete rule), the owner's name,
/// whether a superuser, whether pgoutbox's login role, that role's name, and for a relation
/// with rows of its own (not a partitioned table) its schema and name; the table first, then
/// its descendants, schemas, and what is referenced, most directly first.
pub(super) const JUDGE: &str = "\
    WITH RECURSIVE rels AS ( \
      SELECT $1::pg_catalog.text::pg_catalog.regclass::pg_catalog.oid AS rel, true AS root \
      UNION \
      SELECT i.inhrelid, false FROM pg_catalog.pg_inherits i JOIN rels r ON i.inhparent = r.rel), \
    objs AS ( \
      SELECT 'pg_catalog.pg_class'::pg_catalog.regclass::pg_catalog.oid AS classid, \
             r.rel AS objid, \
             CASE c.relkind WHEN 'p' THEN 'partition key of ' ELSE 'table ' END \
               || r.rel::pg_catalog.regclass::pg_catalog.text AS via \
      FROM rels r JOIN pg_catalog.pg_class c ON c.oid = r.rel \
      UNION ALL \
      SELECT 'pg_catalog.pg_class'::pg_catalog.regclass::pg_catalog.oid, x.indexrelid, \
             'index ' || x.indexrelid::pg_catalog.regclass::pg_catalog.text || ' on ' \
               || x.indrelid::pg_catalog.regclass::pg_catalog.text \
      FROM pg_catalog.pg_index x WHERE x.indrelid IN (SELECT rel FROM rels) \
      UNION ALL \
      SELECT 'pg_catalog.pg_statistic_ext'::pg_catalog.regclass::pg_catalog.oid, s.oid, \
             'statistics object ' || n.nspname::pg_catalog.text || '.' \
               || s.stxname::pg_catalog.text \
               || ' on ' || s.stxrelid::pg_catalog.regclass::pg_catalog.text \
      FROM pg_catalog.pg_statistic_ext s JOIN pg_catalog.pg_namespace n ON n.oid = s.stxnamespace \
      WHERE s.stxrelid IN (SELECT rel FROM rels) \
      UNION ALL \
      SELECT 'pg_catalog.pg_constraint'::pg_catalog.regclass::pg_catalog.oid, k.oid, \
             'constraint ' || k.conname::pg_catalog.text || ' on ' \
               || k.conrelid::pg_catalog.regclass::pg_catalog.text \
      FROM pg_catalog.pg_constraint k WHERE k.conrelid IN (SELECT rel FROM rels) \
      UNION ALL \
      SELECT 'pg_catalog.pg_attrdef'::pg_catalog.regclass::pg_catalog.oid, d.oid, \
             'default of column ' || a.attname::pg_catalog.text || ' on ' \
               || d.adrelid::pg_catalog.regclass::pg_catalog.text \
      FROM pg_catalog.pg_attrdef d \
      JOIN pg_catalog.pg_attribute a ON a.attrelid = d.adrelid AND a.attnum = d.adnum \
      WHERE d.adrelid IN (SELECT rel FROM rels) AND ($2 OR a.attgenerated <> '') \
      UNION ALL \
      SELECT 'pg_catalog.pg_policy'::pg_catalog.regclass::pg_catalog.oid, p.oid, \
             'policy ' || p.polname::pg_catalog.text || ' on ' \
               || p.polrelid::pg_catalog.regclass::pg_catalog.text \
      FROM pg_catalog.pg_policy p WHERE p.polrelid IN (SELECT rel FROM rels) \
      UNION ALL \
      SELECT 'pg_catalog.pg_rewrite'::pg_catalog.regclass::pg_catalog.oid, w.oid, \
             'rule ' || w.rulename::pg_catalog.text || ' on ' \
               || w.ev_class::pg_catalog.regclass::pg_catalog.text \
      FROM pg_catalog.pg_rewrite w \
      WHERE w.ev_class IN (SELECT rel FROM rels) AND w.rulename <> '_RETURN' \
      UNION ALL \
      SELECT 'pg_catalog.pg_trigger'::pg_catalog.regclass::pg_catalog.oid, g.oid, \
             'trigger ' || g.tgname::pg_catalog.text || ' on ' \
               || g.tgrelid::pg_catalog.regclass::pg_catalog.text \
      FROM pg_catalog.pg_trigger g \
      WHERE g.tgrelid IN (SELECT rel FROM rels) AND g.tgenabled <> 'D'), \
    edges AS ( \
      SELECT d.classid, d.objid, d.objsubid, d.refclassid, d.refobjid FROM pg_catalog.pg_depend d \
      WHERE d.deptype IN ('n', 'a') \
        AND d.refclassid IN ('pg_catalog.pg_proc'::pg_catalog.regclass, \
                             'pg_catalog.pg_operator'::pg_catalog.regclass, \
                             'pg_catalog.pg_type'::pg_catalog.regclass, \
                             'pg_catalog.pg_opclass'::pg_catalog.regclass, \
                             'pg_catalog.pg_opfamily'::pg_catalog.regclass) \
      UNION ALL \
      SELECT 'pg_catalog.pg_opfamily'::pg_catalog.regclass, o.amopfamily, 0, \
             'pg_catalog.pg_operator'::pg_catalog.regclass, o.amopopr \
      FROM pg_catalog.pg_amop o \
      UNION ALL \
      SELECT 'pg_catalog.pg_opfamily'::pg_catalog.regclass, p.amprocfamily, 0, \
             'pg_catalog.pg_proc'::pg_catalog.regclass, p.amproc \
      FROM pg_catalog.pg_amproc p \
      UNION ALL \
      SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, k.contypid, 0, \
             'pg_catalog.pg_constraint'::pg_catalog.regclass, k.oid \
      FROM pg_catalog.pg_constraint k WHERE k.contypid <> 0), \
    walk AS ( \
      SELECT o.classid, o.objid, o.via, 0 AS depth FROM objs o \
      UNION \
      SELECT e.refclassid, e.refobjid, \
             CASE WHEN w.depth = 0 AND e.objsubid > 0 \
                       AND e.classid = 'pg_catalog.pg_class'::pg_catalog.regclass \
                  THEN 'column ' || (SELECT a.attname::pg_catalog.text \
                                     FROM pg_catalog.pg_attribute a \
                                     WHERE a.attrelid = e.objid AND a.attnum = e.objsubid) \
                       || ' of ' || e.objid::pg_catalog.regclass::pg_catalog.text \
                  ELSE w.via END, \
             w.depth + 1 \
      FROM walk w JOIN edges e ON e.classid = w.classid AND e.objid = w.objid \
      WHERE w.depth < 6), \
    owned AS ( \
      SELECT CASE WHEN r.root THEN 0 ELSE 1 END AS rank, 0 AS depth, \
             CASE WHEN r.root THEN 'table' WHEN c.relispartition THEN 'partition' \
                  ELSE 'child' END AS kind, \
             r.rel::pg_catalog.regclass::pg_catalog.text AS name, '' AS via, c.relowner AS owner, \
             CASE WHEN c.relkind IN ('r', 'f') THEN n.nspname::pg_catalog.text END AS leaf_schema, \
             CASE WHEN c.relkind IN ('r', 'f') THEN c.relname::pg_catalog.text END AS leaf_name \
      FROM rels r JOIN pg_catalog.pg_class c ON c.oid = r.rel \
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
      UNION ALL \
      SELECT 2, 0, 'schema', n.nspname::pg_catalog.text, '', \
             CASE WHEN n.nspowner = 'pg_database_owner'::pg_catalog.regrole \
                  THEN (SELECT datdba FROM pg_catalog.pg_database \
                        WHERE datname = pg_catalog.current_database()) \
                  ELSE n.nspowner END, NULL, NULL \
      FROM rels r JOIN pg_catalog.pg_class c ON c.oid = r.rel \
      JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
      UNION ALL \
      SELECT 3, w.depth, 'function', p.oid::pg_catalog.regprocedure::pg_catalog.text, w.via, \
             p.proowner, NULL, NULL \
      FROM walk w JOIN pg_catalog.pg_proc p ON p.oid = w.objid \
      WHERE w.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass \
      UNION ALL \
      SELECT 3, w.depth, 'operator', o.oid::pg_catalog.regoperator::pg_catalog.text, w.via, \
             o.oprowner, NULL, NULL \
      FROM walk w JOIN pg_catalog.pg_operator o ON o.oid = w.objid \
      WHERE w.classid = 'pg_catalog.pg_operator'::pg_catalog.regclass \
      UNION ALL \
      SELECT 3, w.depth, 'type', pg_catalog.format_type(t.oid, NULL), w.via, t.typowner, \
             NULL, NULL \
      FROM walk w JOIN pg_catalog.pg_type t ON t.oid = w.objid \
      WHERE w.classid = 'pg_catalog.pg_type'::pg_catalog.regclass \
      UNION ALL \
      SELECT 3, w.depth, 'operator class', \
             n.nspname::pg_catalog.text || '.' || c.opcname::pg_catalog.text, w.via, c.opcowner, \
             NULL, NULL \
      FROM walk w JOIN pg_catalog.pg_opclass c ON c.oid = w.objid \
      JOIN pg_catalog.pg_namespace n ON n.oid = c.opcnamespace \
      WHERE w.classid = 'pg_catalog.pg_opclass'::pg_catalog.regclass \
      UNION ALL \
      SELECT 3, w.depth, 'operator family', \
             n.nspname::pg_catalog.text || '.' || f.opfname::pg_catalog.text, w.via, f.opfowner, \
             NULL, NULL \
      FROM walk w JOIN pg_catalog.pg_opfamily f ON f.oid = w.objid \
      JOIN pg_catalog.pg_namespace n ON n.oid = f.opfnamespace \
      WHERE w.classid = 'pg_catalog.pg_opfamily'::pg_catalog.regclass \
      UNION ALL \
      SELECT 4, 0, 'delete rule', w.rulename::pg_catalog.text, \
             w.ev_class::pg_catalog.regclass::pg_catalog.text, c.relowner, NULL, NULL \
      FROM pg_catalog.pg_rewrite w JOIN pg_catalog.pg_class c ON c.oid = w.ev_class \
      WHERE w.ev_class IN (SELECT rel FROM rels) AND w.ev_type = '4' AND $2) \
    SELECT o.kind, o.name, o.via, r.rolname::pg_catalog.text, r.rolsuper, \
           r.rolname = current_user, current_user::pg_catalog.text, o.leaf_schema, o.leaf_name \
    FROM (SELECT kind, name, via, owner, leaf_schema, leaf_name, \
                 pg_catalog.min(rank) AS rank, pg_catalog.min(depth) AS depth \
          FROM owned GROUP BY kind, name, via, owner, leaf_schema, leaf_name) o \
    JOIN pg_catalog.pg_roles r ON r.oid = o.owner \
    ORDER BY o.rank, o.depth, o.via, o.name";
