"""Append-only ingest: raw aggregates partitioned by day, folded into trial sums by the refit owner

Every replica used to add each report into ``trials`` in the report's own transaction: an
``INSERT … ON CONFLICT DO UPDATE`` into the few thousand rows of the current hour bucket, whose
row locks every replica held through its NOTIFY and WAL flush, so replicas queued behind each
other instead of adding capacity (issue #32). Now:

- ``report_aggregates`` is partitioned by ``stored_at`` (one partition per UTC day, a default
  partition as a safety net, and one partition for the rows older than this migration), and each
  row records the transaction that stored it (``xid``, ``pg_current_xact_id()``) and its trial
  ``bucket``. Ingest only appends there (COPY).
- ``trials`` becomes ``trial_sums``: the folded sums, written only by the fold
  (``storage/fold.py``), which adds every aggregate stored by a transaction in
  ``[fold_watermarks.folded_xid, xmin)`` and moves the policy's watermark to ``xmin`` in the
  same transaction.
- ``trials`` is now a view: ``trial_sums`` plus the aggregates not folded yet, summed per trial
  key, so every reader sees a report as soon as it is stored, exactly once, whether it has been
  folded or not.
- ``fold_watermarks`` holds one row per policy (a trigger adds it with the policy). Existing
  policies start at this migration's snapshot xmin, and existing aggregates carry xid 0: they
  were added to ``trials`` by the old ingest and are never folded again.

Replicas of an older version must not ingest while this runs or after it (they would add to
``trial_sums`` directly and the fold would add the same reports again): ``booster migrate``
runs before replicas of this version start, as for every migration.

Downgrade folds everything pending, then restores the table ``trials`` and an unpartitioned
``report_aggregates`` with every row kept.

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-27 23:00:00
"""

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

SUMS = (
    "flow_count, tpt_sum, tpt_sq_sum, delay_sum, delay_sq_sum, tpt_delay_sum, slow_flows, "
    "report_count"
)
KEY = "policy_id, context_id, cc, theta_key, bucket"
RAW = (
    "report_pk, policy_id, context_id, cc, theta_key, theta_version, flow_count, tpt_sum, "
    "tpt_sq_sum, delay_sum, delay_sq_sum, tpt_delay_sum, slow_flows, size_buckets, sketch, "
    "delay_sketch"
)

# The live view: folded sums plus the aggregates stored since the policy's watermark. Every
# column readers filter on (policy, context, bucket) is a grouping column, so PostgreSQL pushes
# such filters into both branches (the trial_sums index, and the aggregates' (policy_id, xid)
# index per partition).
TRIALS_VIEW = f"""
CREATE VIEW trials AS
SELECT max(id) AS id, {KEY},
       sum(flow_count)::bigint AS flow_count, sum(tpt_sum) AS tpt_sum,
       sum(tpt_sq_sum) AS tpt_sq_sum, sum(delay_sum) AS delay_sum,
       sum(delay_sq_sum) AS delay_sq_sum, sum(tpt_delay_sum) AS tpt_delay_sum,
       sum(slow_flows)::bigint AS slow_flows, sum(report_count)::bigint AS report_count,
       min(first_seen) AS first_seen, max(last_seen) AS last_seen
FROM (
    SELECT id, {KEY}, {SUMS}, first_seen, last_seen FROM trial_sums
    UNION ALL
    SELECT -a.id, a.policy_id, a.context_id, a.cc, a.theta_key, a.bucket, a.flow_count,
           a.tpt_sum, a.tpt_sq_sum, a.delay_sum, a.delay_sq_sum, a.tpt_delay_sum,
           a.slow_flows, 1, a.stored_at, a.stored_at
    FROM report_aggregates a JOIN fold_watermarks w ON w.policy_id = a.policy_id
    WHERE a.xid >= w.folded_xid
) live
GROUP BY {KEY}
"""


def _partitioned_aggregates() -> None:
    op.execute("ALTER TABLE report_aggregates RENAME TO report_aggregates_unpartitioned")
    op.execute(
        """
        CREATE TABLE report_aggregates (
            id bigint NOT NULL DEFAULT nextval('report_aggregates_id_seq'),
            report_pk bigint NOT NULL REFERENCES reports(id) ON DELETE CASCADE,
            policy_id integer NOT NULL REFERENCES policies(id),
            context_id integer NOT NULL REFERENCES contexts(id),
            cc varchar(16) NOT NULL DEFAULT '',
            theta_key varchar(96) NOT NULL,
            theta_version bigint NOT NULL,
            flow_count bigint NOT NULL,
            tpt_sum double precision NOT NULL,
            tpt_sq_sum double precision NOT NULL,
            delay_sum double precision NOT NULL,
            delay_sq_sum double precision NOT NULL,
            tpt_delay_sum double precision NOT NULL,
            slow_flows bigint NOT NULL,
            size_buckets bigint[] NOT NULL,
            sketch bytea NOT NULL,
            delay_sketch bytea NOT NULL DEFAULT ''::bytea,
            bucket timestamptz NOT NULL,
            stored_at timestamptz NOT NULL DEFAULT now(),
            xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
            PRIMARY KEY (id, stored_at)
        ) PARTITION BY RANGE (stored_at)
        """
    )
    op.execute("ALTER SEQUENCE report_aggregates_id_seq OWNED BY report_aggregates.id")
    op.execute("CREATE INDEX report_aggregates_report_pk ON report_aggregates (report_pk)")
    op.execute("CREATE INDEX report_aggregates_policy_xid ON report_aggregates (policy_id, xid)")
    op.execute("CREATE TABLE report_aggregates_default PARTITION OF report_aggregates DEFAULT")
    # Rows older than today go to one partition named after its upper bound's eve (the naming
    # of daily partitions: report_aggregates_dYYYYMMDD holds rows stored before YYYYMMDD + 1).
    op.execute(
        """
        DO $$
        DECLARE today date := (now() AT TIME ZONE 'UTC')::date;
        BEGIN
          EXECUTE format(
            'CREATE TABLE report_aggregates_d%s PARTITION OF report_aggregates '
            'FOR VALUES FROM (MINVALUE) TO (%L)',
            to_char(today - 1, 'YYYYMMDD'), (today::timestamp AT TIME ZONE 'UTC'));
          FOR d IN 0..2 LOOP
            EXECUTE format(
              'CREATE TABLE report_aggregates_d%s PARTITION OF report_aggregates '
              'FOR VALUES FROM (%L) TO (%L)',
              to_char(today + d, 'YYYYMMDD'),
              ((today + d)::timestamp AT TIME ZONE 'UTC'),
              ((today + d + 1)::timestamp AT TIME ZONE 'UTC'));
          END LOOP;
        END $$
        """
    )
    op.execute(
        f"""
        INSERT INTO report_aggregates (id, {RAW}, bucket, stored_at, xid)
        SELECT a.id, {", ".join(f"a.{c.strip()}" for c in RAW.split(","))},
               to_timestamp(floor(extract(epoch FROM r.interval_end)
                                  / (p.trial_bucket_hours * 3600))
                            * p.trial_bucket_hours * 3600),
               r.received_at, '0'::xid8
        FROM report_aggregates_unpartitioned a
        JOIN reports r ON r.id = a.report_pk JOIN policies p ON p.id = a.policy_id
        """
    )
    op.execute("ALTER SEQUENCE report_aggregates_id_seq OWNED BY NONE")
    op.execute("DROP TABLE report_aggregates_unpartitioned")
    op.execute("ALTER SEQUENCE report_aggregates_id_seq OWNED BY report_aggregates.id")


def _watermarks() -> None:
    op.execute(
        """
        CREATE TABLE fold_watermarks (
            policy_id integer PRIMARY KEY REFERENCES policies(id) ON DELETE CASCADE,
            folded_xid xid8 NOT NULL,
            folded_at timestamptz NOT NULL DEFAULT now()
        )
        """
    )
    op.execute(
        "INSERT INTO fold_watermarks (policy_id, folded_xid) "
        "SELECT id, pg_snapshot_xmin(pg_current_snapshot()) FROM policies"
    )
    op.execute(
        """
        CREATE FUNCTION fold_watermark_for_policy() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
          INSERT INTO fold_watermarks (policy_id, folded_xid) VALUES (NEW.id, '0'::xid8);
          RETURN NEW;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER policies_fold_watermark AFTER INSERT ON policies "
        "FOR EACH ROW EXECUTE FUNCTION fold_watermark_for_policy()"
    )


def upgrade() -> None:
    # The old ingest added to trials in the report's transaction: none may run meanwhile.
    op.execute("LOCK TABLE trials, report_aggregates IN ACCESS EXCLUSIVE MODE")
    op.execute("ALTER TABLE trials RENAME TO trial_sums")
    _partitioned_aggregates()
    _watermarks()
    op.execute(TRIALS_VIEW)


def downgrade() -> None:
    op.execute("LOCK TABLE trial_sums, report_aggregates IN ACCESS EXCLUSIVE MODE")
    # Fold what is pending, so the restored trials hold every stored report: the view's
    # totals per key replace the folded sums (a key only pending takes a new id).
    op.execute("CREATE TEMPORARY TABLE live_trials ON COMMIT DROP AS SELECT * FROM trials")
    op.execute("DELETE FROM trial_sums")
    op.execute(
        f"""
        INSERT INTO trial_sums (id, {KEY}, {SUMS}, first_seen, last_seen)
        SELECT CASE WHEN id > 0 THEN id ELSE nextval('trials_id_seq') END,
               {KEY}, {SUMS}, first_seen, last_seen
        FROM live_trials
        """
    )
    op.execute("DROP VIEW trials")
    op.execute("DROP TRIGGER policies_fold_watermark ON policies")
    op.execute("DROP FUNCTION fold_watermark_for_policy()")
    op.execute("DROP TABLE fold_watermarks")
    op.execute("ALTER TABLE trial_sums RENAME TO trials")
    op.execute("ALTER TABLE report_aggregates RENAME TO report_aggregates_partitioned")
    op.execute(
        f"""
        CREATE TABLE report_aggregates (
            id bigint PRIMARY KEY DEFAULT nextval('report_aggregates_id_seq'),
            report_pk bigint NOT NULL REFERENCES reports(id) ON DELETE CASCADE,
            policy_id integer NOT NULL REFERENCES policies(id),
            context_id integer NOT NULL REFERENCES contexts(id),
            cc varchar(16) NOT NULL DEFAULT '',
            theta_key varchar(96) NOT NULL,
            theta_version bigint NOT NULL,
            flow_count bigint NOT NULL,
            tpt_sum double precision NOT NULL,
            tpt_sq_sum double precision NOT NULL,
            delay_sum double precision NOT NULL,
            delay_sq_sum double precision NOT NULL,
            tpt_delay_sum double precision NOT NULL,
            slow_flows bigint NOT NULL,
            size_buckets bigint[] NOT NULL,
            sketch bytea NOT NULL,
            delay_sketch bytea NOT NULL DEFAULT ''::bytea
        );
        INSERT INTO report_aggregates (id, {RAW})
        SELECT id, {RAW} FROM report_aggregates_partitioned;
        ALTER SEQUENCE report_aggregates_id_seq OWNED BY NONE;
        DROP TABLE report_aggregates_partitioned;
        ALTER SEQUENCE report_aggregates_id_seq OWNED BY report_aggregates.id;
        CREATE INDEX ix_report_aggregates_report_pk ON report_aggregates (report_pk);
        """
    )
