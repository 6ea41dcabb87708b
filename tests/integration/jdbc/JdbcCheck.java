import java.sql.*;
import java.math.BigDecimal;
import java.util.*;

/**
 * What a Java application does through the PostgreSQL JDBC driver (pgjdbc), step by step: each
 * step prints "ok" or "FAIL" lines; tests/integration/test_jdbc.py runs it against PostgreSQL
 * itself, the proxy in front of it (session and transaction pooling) and the embedded server.
 *
 *   java -cp .:postgresql.jar JdbcCheck PORT USER
 */
public class JdbcCheck {
  static int fails = 0;
  static void check(String what, Object got, Object want) {
    boolean ok = Objects.equals(String.valueOf(got), String.valueOf(want));
    System.out.println((ok ? "ok   " : "FAIL ") + what + ": " + got + (ok ? "" : " (want " + want + ")"));
    if (!ok) fails++;
  }
  interface Step { void run() throws Exception; }
  static void step(String what, Step s) {
    try { s.run(); } catch (Exception e) { System.out.println("FAIL " + what + ": " + e.toString().replace("\n", " ")); fails++; }
  }
  public static void main(String[] a) throws Exception {
    String url = "jdbc:postgresql://127.0.0.1:" + a[0] + "/postgres";
    Properties p = new Properties(); p.setProperty("user", a.length > 1 ? a[1] : "postgres"); p.setProperty("password", "x");
    try (Connection c = DriverManager.getConnection(url, p)) {
      Statement st = c.createStatement();
      step("ddl", () -> {
        st.execute("DROP TABLE IF EXISTS jt");
        st.execute("CREATE TABLE jt (id serial PRIMARY KEY, name text NOT NULL, amount numeric(12,2), born date, at timestamp, flag boolean, data bytea, tags text[])");
      });
      step("prepared insert x10 (server-prepared after 5)", () -> {
        PreparedStatement ps = c.prepareStatement("INSERT INTO jt (name, amount, born, at, flag, data) VALUES (?, ?, ?, ?, ?, ?)");
        for (int i = 0; i < 10; i++) {
          ps.setString(1, "n" + i); ps.setBigDecimal(2, new BigDecimal("12.5").add(BigDecimal.valueOf(i)));
          ps.setDate(3, java.sql.Date.valueOf("2020-01-0" + (i % 9 + 1)));
          ps.setTimestamp(4, Timestamp.valueOf("2021-02-03 04:05:06.5"));
          ps.setBoolean(5, i % 2 == 0); ps.setBytes(6, new byte[]{1, 2, (byte) i});
          check("insert " + i, ps.executeUpdate(), 1);
        }
      });
      step("batch", () -> {
        PreparedStatement ps = c.prepareStatement("INSERT INTO jt (name, amount) VALUES (?, ?)");
        for (int i = 0; i < 50; i++) { ps.setString(1, "b" + i); ps.setBigDecimal(2, BigDecimal.ONE); ps.addBatch(); }
        int[] r = ps.executeBatch();
        check("batch rows", r.length, 50);
      });
      step("generated keys", () -> {
        PreparedStatement ps = c.prepareStatement("INSERT INTO jt (name) VALUES (?)", Statement.RETURN_GENERATED_KEYS);
        ps.setString(1, "gk"); ps.executeUpdate();
        ResultSet rs = ps.getGeneratedKeys(); rs.next();
        check("generated id", rs.getInt("id"), 61);
      });
      step("select typed x8", () -> {
        PreparedStatement ps = c.prepareStatement("SELECT id, name, amount, born, at, flag, data FROM jt WHERE id = ?");
        for (int i = 1; i <= 8; i++) {
          ps.setInt(1, i);
          ResultSet rs = ps.executeQuery(); rs.next();
          check("row " + i, rs.getString(2) + "|" + rs.getBigDecimal(3) + "|" + rs.getDate(4) + "|" + rs.getTimestamp(5) + "|" + rs.getBoolean(6) + "|" + Arrays.toString(rs.getBytes(7)),
                "n" + (i-1) + "|" + new BigDecimal("12.50").add(BigDecimal.valueOf(i-1)) + "|2020-01-0" + ((i-1)%9+1) + "|2021-02-03 04:05:06.5|" + ((i-1)%2==0) + "|[1, 2, " + (i-1) + "]");
        }
      });
      step("transaction rollback", () -> {
        c.setAutoCommit(false);
        st.executeUpdate("DELETE FROM jt");
        c.rollback();
        c.setAutoCommit(true);
        ResultSet rs = st.executeQuery("SELECT count(*) FROM jt"); rs.next();
        check("count after rollback", rs.getLong(1), 61);
      });
      step("fetch size (portal)", () -> {
        c.setAutoCommit(false);
        Statement s2 = c.createStatement(); s2.setFetchSize(7);
        ResultSet rs = s2.executeQuery("SELECT id FROM jt ORDER BY id");
        int n = 0; long sum = 0; while (rs.next()) { n++; sum += rs.getLong(1); }
        check("fetched rows", n, 61);
        c.commit(); c.setAutoCommit(true);
      });
      step("array param", () -> {
        PreparedStatement ps = c.prepareStatement("SELECT count(*) FROM jt WHERE id = ANY(?)");
        ps.setArray(1, c.createArrayOf("int4", new Integer[]{1, 2, 3}));
        ResultSet rs = ps.executeQuery(); rs.next();
        check("any(array)", rs.getLong(1), 3);
      });
      step("text[] result", () -> {
        ResultSet rs = st.executeQuery("SELECT ARRAY['a','b']::text[] AS t");
        rs.next(); check("array", Arrays.toString((Object[]) rs.getArray(1).getArray()), "[a, b]");
      });
      step("metadata getTables", () -> {
        ResultSet rs = c.getMetaData().getTables(null, "public", "jt", new String[]{"TABLE"});
        check("table found", rs.next() ? rs.getString("TABLE_NAME") : null, "jt");
      });
      step("metadata getColumns", () -> {
        ResultSet rs = c.getMetaData().getColumns(null, "public", "jt", null);
        List<String> cols = new ArrayList<>(); while (rs.next()) cols.add(rs.getString("COLUMN_NAME") + ":" + rs.getString("TYPE_NAME"));
        check("columns", cols, "[id:serial, name:text, amount:numeric, born:date, at:timestamp, flag:bool, data:bytea, tags:_text]");
      });
      step("metadata getPrimaryKeys", () -> {
        ResultSet rs = c.getMetaData().getPrimaryKeys(null, "public", "jt");
        check("pk", rs.next() ? rs.getString("COLUMN_NAME") : null, "id");
      });
      step("setObject java.time", () -> {
        st.execute("DROP TABLE IF EXISTS jt2");
        st.execute("CREATE TABLE jt2 (d date, t timestamp, tz timestamptz, u uuid, n numeric, f float8, l bigint, i int, b bytea, s text)");
        PreparedStatement ps = c.prepareStatement("INSERT INTO jt2 VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)");
        for (int k = 0; k < 7; k++) {
          ps.setObject(1, java.time.LocalDate.of(2020, 1, 2));
          ps.setObject(2, java.time.LocalDateTime.of(2020, 1, 2, 3, 4, 5, 600000000));
          ps.setObject(3, java.time.OffsetDateTime.of(2020, 1, 2, 3, 4, 5, 0, java.time.ZoneOffset.ofHours(2)));
          ps.setObject(4, java.util.UUID.fromString("123e4567-e89b-12d3-a456-426614174000"));
          ps.setObject(5, new BigDecimal("-12345.678901"));
          ps.setDouble(6, 1.5e-7); ps.setLong(7, 9000000000L);
          if (k % 2 == 0) ps.setNull(8, Types.INTEGER); else ps.setInt(8, k);
          ps.setBytes(9, new byte[]{0, (byte) 255}); ps.setString(10, "héllo ✓");
          ps.executeUpdate();
        }
        PreparedStatement q = c.prepareStatement("SELECT d, t, tz, u, n, f, l, i, b, s FROM jt2 WHERE u = ? AND d = ? LIMIT 1");
        for (int k = 0; k < 7; k++) {
          q.setObject(1, java.util.UUID.fromString("123e4567-e89b-12d3-a456-426614174000"));
          q.setObject(2, java.time.LocalDate.of(2020, 1, 2));
          ResultSet rs = q.executeQuery(); rs.next();
          check("java.time " + k, rs.getObject(1, java.time.LocalDate.class) + "|" + rs.getObject(2, java.time.LocalDateTime.class) + "|"
            + rs.getObject(3, java.time.OffsetDateTime.class).toInstant() + "|" + rs.getObject(4) + "|" + rs.getBigDecimal(5) + "|" + rs.getDouble(6) + "|" + rs.getLong(7) + "|" + rs.getObject(8)
            + "|" + Arrays.toString(rs.getBytes(9)) + "|" + rs.getString(10),
            "2020-01-02|2020-01-02T03:04:05.600|2020-01-02T01:04:05Z|123e4567-e89b-12d3-a456-426614174000|-12345.678901|1.5E-7|9000000000|null|[0, -1]|héllo ✓");
        }
      });
      step("scrollable", () -> {
        Statement s4 = c.createStatement(ResultSet.TYPE_SCROLL_INSENSITIVE, ResultSet.CONCUR_READ_ONLY);
        ResultSet rs = s4.executeQuery("SELECT id FROM jt ORDER BY id");
        rs.last(); check("last", rs.getInt(1), 61); rs.first(); check("first", rs.getInt(1), 1);
      });
      step("isValid", () -> check("valid", c.isValid(2), true));
      step("metadata keys", () -> {
        st.execute("DROP TABLE IF EXISTS jchild"); st.execute("DROP TABLE IF EXISTS jparent");
        st.execute("CREATE TABLE jparent (id int PRIMARY KEY, code text UNIQUE)");
        st.execute("CREATE TABLE jchild (id int PRIMARY KEY, parent int REFERENCES jparent(id))");
        st.execute("CREATE INDEX jchild_parent ON jchild(parent)");
        ResultSet rs = c.getMetaData().getImportedKeys(null, "public", "jchild");
        check("fk", rs.next() ? rs.getString("PKTABLE_NAME") + "." + rs.getString("PKCOLUMN_NAME") + "->" + rs.getString("FKCOLUMN_NAME") : null, "jparent.id->parent");
        rs = c.getMetaData().getIndexInfo(null, "public", "jchild", false, false);
        List<String> ix = new ArrayList<>(); while (rs.next()) ix.add(rs.getString("INDEX_NAME") + ":" + rs.getString("COLUMN_NAME"));
        Collections.sort(ix); check("indexes", ix, "[jchild_parent:parent, jchild_pkey:id]");
        rs = c.getMetaData().getTypeInfo(); int n = 0; while (rs.next()) n++;
        check("type info has rows", n > 10, true);
        rs = c.getMetaData().getSchemas(); List<String> sc = new ArrayList<>(); while (rs.next()) sc.add(rs.getString(1));
        check("public schema listed", sc.contains("public"), true);
      });
      step("batch with generated keys", () -> {
        PreparedStatement ps = c.prepareStatement("INSERT INTO jparent (id, code) VALUES (?, ?)", new String[]{"id"});
        for (int k = 1; k <= 3; k++) { ps.setInt(1, k); ps.setString(2, "c" + k); ps.addBatch(); }
        ps.executeBatch(); ResultSet rs = ps.getGeneratedKeys(); int n = 0; while (rs.next()) n++;
        check("batch keys", n, 3);
      });
      step("unique violation sqlstate", () -> {
        try { st.executeUpdate("INSERT INTO jparent VALUES (1, 'x')"); check("raised", false, true); }
        catch (SQLException e) { check("sqlstate", e.getSQLState(), "23505"); }
      });
      step("upsert", () -> {
        check("upsert", st.executeUpdate("INSERT INTO jparent VALUES (1, 'z') ON CONFLICT (id) DO UPDATE SET code = excluded.code"), 1);
      });
      step("savepoint", () -> {
        c.setAutoCommit(false);
        st.executeUpdate("INSERT INTO jt (name) VALUES ('sp1')");
        Savepoint sp = c.setSavepoint();
        st.executeUpdate("INSERT INTO jt (name) VALUES ('sp2')");
        c.rollback(sp);
        c.commit(); c.setAutoCommit(true);
        ResultSet rs = st.executeQuery("SELECT count(*) FROM jt WHERE name LIKE 'sp%'"); rs.next();
        check("savepoint rows", rs.getLong(1), 1);
      });
      step("after savepoint, connection usable", () -> {
        try { c.rollback(); } catch (Exception e) {}
        c.setAutoCommit(true);
        ResultSet rs = st.executeQuery("SELECT 1"); rs.next(); check("select 1", rs.getInt(1), 1);
      });
      step("error then continue", () -> {
        try { st.executeQuery("SELECT * FROM nope"); check("error raised", false, true); }
        catch (SQLException e) { check("sqlstate", e.getSQLState(), "42P01"); }
        ResultSet rs = st.executeQuery("SELECT 2"); rs.next(); check("after error", rs.getInt(1), 2);
      });
      step("timestamptz / uuid / json", () -> {
        ResultSet rs = st.executeQuery("SELECT '2020-01-01 00:00:00+00'::timestamptz, '123e4567-e89b-12d3-a456-426614174000'::uuid, '{\"a\": 1}'::json");
        rs.next(); check("uuid", rs.getObject(2), "123e4567-e89b-12d3-a456-426614174000");
        check("json", rs.getString(3).replace(" ", ""), "{\"a\":1}");
        check("tstz", rs.getTimestamp(1).getTime(), 1577836800000L);
      });
      step("update count", () -> check("update", st.executeUpdate("UPDATE jt SET flag = true WHERE id <= 10"), 10));
      step("multi-statement", () -> {
        boolean r = st.execute("SELECT 1; SELECT 2");
        ResultSet rs = st.getResultSet(); rs.next(); check("first", rs.getInt(1), 1);
        st.getMoreResults(); rs = st.getResultSet(); rs.next(); check("second", rs.getInt(1), 2);
      });
      step("cancel/timeout", () -> {
        Statement s3 = c.createStatement(); s3.setQueryTimeout(1);
        try { s3.executeQuery("SELECT pg_sleep(5)"); check("timeout raised", false, true); }
        catch (SQLException e) { check("timeout sqlstate", e.getSQLState(), "57014"); }
        ResultSet rs = st.executeQuery("SELECT 3"); rs.next(); check("after cancel", rs.getInt(1), 3);
      });
    }
    System.out.println(fails == 0 ? "ALL OK" : fails + " FAILED");
  }
}
