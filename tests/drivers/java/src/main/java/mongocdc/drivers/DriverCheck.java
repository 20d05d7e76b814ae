package mongocdc.drivers;

import com.mongodb.ConnectionString;
import com.mongodb.MongoClientSettings;
import com.mongodb.client.ChangeStreamIterable;
import com.mongodb.client.ClientSession;
import com.mongodb.client.MongoChangeStreamCursor;
import com.mongodb.client.MongoClient;
import com.mongodb.client.MongoClients;
import com.mongodb.client.MongoCollection;
import com.mongodb.client.MongoDatabase;
import com.mongodb.client.model.Aggregates;
import com.mongodb.client.model.Filters;
import com.mongodb.client.model.Sorts;
import com.mongodb.client.model.Updates;
import com.mongodb.client.model.changestream.ChangeStreamDocument;
import com.mongodb.client.model.changestream.FullDocument;
import com.mongodb.client.result.DeleteResult;
import com.mongodb.client.result.InsertOneResult;
import com.mongodb.client.result.UpdateResult;
import java.io.IOException;
import java.io.InputStream;
import java.util.ArrayList;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import java.util.function.UnaryOperator;
import org.bson.BsonDocument;
import org.bson.BsonTimestamp;
import org.bson.BsonValue;
import org.bson.Document;
import org.bson.json.JsonMode;
import org.bson.json.JsonWriterSettings;

/**
 * Exercises the MongoDB Java sync driver against a replica set the way a CDC client does.
 *
 * <p>Usage: {@code java -jar driver-check.jar <connection string> <database> [auto-resume]}. It
 * connects, writes, reads a collection change stream, resumes it with {@code resumeAfter} and
 * {@code startAfter} (also from the stream's own post-batch resume token and after an
 * invalidate), follows a transaction with {@code fullDocument: updateLookup}, opens a
 * deployment-wide stream with {@code startAtOperationTime}, and prints one JSON line with
 * everything it saw, so that the caller (tests/drivers/test_official_drivers.py) asserts on
 * exactly the same scenario for every driver (tests/drivers/node/check.mjs is the Node.js twin).
 * With {@code auto-resume} it checks instead that the driver resumes by itself after getMore
 * failures injected with the failCommand fail point. Any failure exits 1 with the phase and the
 * driver's own message on stderr.
 */
public final class DriverCheck {
    private static final String COLLECTION = "driver_check";
    /** How long one phase waits for the change events it expects before it gives up. */
    private static final long EVENT_DEADLINE_MS = 20_000;
    /** Server-side wait of each getMore; also the quiet period that proves no extra event follows. */
    private static final long MAX_AWAIT_MS = 300;
    /** Scenario argument: the driver's own resume after network and resumable server errors. */
    private static final String AUTO_RESUME = "auto-resume";
    /** Fail points are scoped to this client's connections by appName. */
    private static final String APP_NAME = "mongocdc-driver-check";

    private final MongoClient client;
    private final MongoDatabase db;
    private final MongoCollection<Document> coll;
    private String phase = "connect";

    private DriverCheck(MongoClient client, String database) {
        this.client = client;
        this.db = client.getDatabase(database);
        this.coll = db.getCollection(COLLECTION);
    }

    public static void main(String[] args) {
        if (args.length < 2 || args.length > 3 || (args.length == 3 && !AUTO_RESUME.equals(args[2]))) {
            System.err.println("usage: java -jar driver-check.jar <mongodb connection string> <database name> ["
                    + AUTO_RESUME + "]");
            System.exit(2);
        }
        DriverCheck check = null;
        try {
            MongoClientSettings settings = MongoClientSettings.builder()
                    .applyConnectionString(new ConnectionString(args[0]))
                    .applicationName(APP_NAME)
                    .applyToClusterSettings(b -> b.serverSelectionTimeout(15, TimeUnit.SECONDS))
                    .build();
            try (MongoClient client = MongoClients.create(settings)) {
                check = new DriverCheck(client, args[1]);
                Document result = args.length == 3 ? check.runAutoResume() : check.run();
                result.put("driver", "java-sync " + driverVersion());
                System.out.println(result.toJson(JsonWriterSettings.builder().outputMode(JsonMode.RELAXED).build()));
            }
        } catch (Exception e) {
            String where = check == null ? "connect" : check.phase;
            System.err.println("DriverCheck (Java sync driver) failed in phase '" + where + "': " + e);
            e.printStackTrace(System.err);
            System.exit(1);
        }
    }

    /** The driver version pom.xml built against, from the resource Maven filters at build time. */
    private static String driverVersion() throws IOException {
        Properties properties = new Properties();
        try (InputStream in = DriverCheck.class.getResourceAsStream("/driver-check.properties")) {
            if (in == null) {
                throw new IOException("driver-check.properties is missing from the jar; rebuild with mvn package");
            }
            properties.load(in);
        }
        return properties.getProperty("mongodb.driver.version");
    }

    private Document run() {
        Document out = new Document();
        phase = "hello";
        Document hello = db.runCommand(new Document("hello", 1));
        Document buildInfo = db.runCommand(new Document("buildInfo", 1));
        out.put("server", new Document("setName", hello.get("setName"))
                .append("isWritablePrimary", hello.get("isWritablePrimary"))
                .append("version", buildInfo.get("version")));

        phase = "drop";
        coll.drop();
        db.createCollection(COLLECTION);

        phase = "open change stream";
        List<Document> first;
        BsonDocument tokenAfterUpdate;
        BsonDocument latestToken;
        try (MongoChangeStreamCursor<ChangeStreamDocument<Document>> stream = watch(w -> w)) {
            phase = "writes";
            InsertOneResult i1 = coll.insertOne(new Document("_id", 1).append("v", 1));
            InsertOneResult i2 = coll.insertOne(new Document("_id", 2).append("v", 1));
            UpdateResult u1 = coll.updateOne(Filters.eq("_id", 1), Updates.set("v", 2));
            UpdateResult r2 = coll.replaceOne(Filters.eq("_id", 2), new Document("_id", 2).append("v", 3));
            DeleteResult d1 = coll.deleteOne(Filters.eq("_id", 1));
            out.put("writes", new Document("inserted", List.of(i1.getInsertedId(), i2.getInsertedId()))
                    .append("matched", List.of(u1.getMatchedCount(), r2.getMatchedCount()))
                    .append("modified", List.of(u1.getModifiedCount(), r2.getModifiedCount()))
                    .append("deleted", d1.getDeletedCount()));

            phase = "find";
            out.put("documents", coll.find().sort(Sorts.ascending("_id")).into(new ArrayList<>()));

            phase = "read change stream";
            List<ChangeStreamDocument<Document>> events = read(stream, 5);
            first = describe(events);
            tokenAfterUpdate = events.get(2).getResumeToken();
            latestToken = stream.getResumeToken();
        }
        out.put("events", first);

        phase = "writes while closed";
        coll.insertOne(new Document("_id", 3).append("v", 1).append("tmp", true));
        coll.updateOne(Filters.eq("_id", 3), Updates.combine(Updates.set("v", 4), Updates.unset("tmp")));

        phase = "resumeAfter";
        out.put("resumeAfter", readResumed(w -> w.resumeAfter(tokenAfterUpdate), 4));
        phase = "startAfter";
        out.put("startAfter", readResumed(w -> w.startAfter(tokenAfterUpdate), 4));

        phase = "resumeAfter post-batch resume token";
        BsonDocument lastUpdateToken;
        try (MongoChangeStreamCursor<ChangeStreamDocument<Document>> stream = watch(w -> w.resumeAfter(latestToken))) {
            List<ChangeStreamDocument<Document>> events = read(stream, 2);
            out.put("resumeLatest", describe(events));
            lastUpdateToken = events.get(events.size() - 1).getResumeToken();
        }

        phase = "invalidate";
        BsonDocument invalidateToken;
        try (MongoChangeStreamCursor<ChangeStreamDocument<Document>> stream = watch(w -> w.resumeAfter(lastUpdateToken))) {
            coll.drop();
            List<ChangeStreamDocument<Document>> events = readUntilInvalidate(stream);
            out.put("invalidate", describe(events));
            invalidateToken = events.get(events.size() - 1).getResumeToken();
        }

        phase = "startAfter invalidate";
        coll.insertOne(new Document("_id", 10).append("v", 1));
        out.put("afterInvalidate", readResumed(w -> w.startAfter(invalidateToken), 1));

        phase = "transaction";
        try (MongoChangeStreamCursor<ChangeStreamDocument<Document>> stream =
                     watch(w -> w.fullDocument(FullDocument.UPDATE_LOOKUP));
             ClientSession session = client.startSession()) {
            session.withTransaction(() -> {
                coll.insertOne(session, new Document("_id", 20).append("v", 1));
                coll.updateOne(session, Filters.eq("_id", 10), Updates.set("v", 2));
                return null;
            });
            out.put("transaction", describe(read(stream, 2)));
        }

        // What a CDC connector does after its snapshot: a deployment-wide stream from the
        // operationTime of a write, filtered to its databases.
        phase = "deployment stream startAtOperationTime";
        BsonTimestamp start;
        try (ClientSession session = client.startSession()) {
            coll.insertOne(session, new Document("_id", 30));
            start = session.getOperationTime();
        }
        coll.deleteOne(Filters.eq("_id", 30));
        try (MongoChangeStreamCursor<ChangeStreamDocument<Document>> stream =
                     client.watch(List.of(Aggregates.match(Filters.eq("ns.db", db.getName()))))
                             .startAtOperationTime(start)
                             .maxAwaitTime(MAX_AWAIT_MS, TimeUnit.MILLISECONDS)
                             .cursor()) {
            out.put("deployment", describe(read(stream, 2)));
        }
        coll.drop();
        return out;
    }

    /**
     * The driver resumes a change stream by itself when a getMore fails with a network error or a
     * resumable server error (mongod's failCommand fail point, as in the drivers' own spec tests):
     * the events keep coming, each exactly once.
     */
    private Document runAutoResume() {
        Document out = new Document();
        phase = "drop";
        coll.drop();
        db.createCollection(COLLECTION);
        List<Object> triggered = new ArrayList<>();
        try (MongoChangeStreamCursor<ChangeStreamDocument<Document>> stream = watch(w -> w)) {
            phase = "first event";
            coll.insertOne(new Document("_id", 1));
            List<ChangeStreamDocument<Document>> events = new ArrayList<>(read(stream, 1));

            phase = "resume after the connection closes during getMore";
            failGetMore(new Document("closeConnection", true));
            coll.insertMany(List.of(new Document("_id", 2), new Document("_id", 3)));
            events.addAll(read(stream, 2));
            triggered.add(failPointOff());

            // failCommand does not add mongod's ResumableChangeStreamError label by itself (the
            // drivers' spec tests rely on that), so the fail point names it, as those tests do.
            phase = "resume after a getMore error labelled ResumableChangeStreamError";
            failGetMore(new Document("errorCode", 11602).append("errorLabels", List.of("ResumableChangeStreamError")));
            coll.insertOne(new Document("_id", 4));
            events.addAll(read(stream, 1));
            triggered.add(failPointOff());
            out.put("events", describe(events));
        } finally {
            failPointOff();
        }
        out.put("faultsTriggered", triggered);
        coll.drop();
        return out;
    }

    private void failGetMore(Document data) {
        client.getDatabase("admin").runCommand(new Document("configureFailPoint", "failCommand")
                .append("mode", new Document("times", 1))
                .append("data", data.append("failCommands", List.of("getMore")).append("appName", APP_NAME)));
    }

    /** Turns the fail point off; mongod replies with how often it triggered. */
    private Object failPointOff() {
        return client.getDatabase("admin").runCommand(
                new Document("configureFailPoint", "failCommand").append("mode", "off")).get("count");
    }

    private MongoChangeStreamCursor<ChangeStreamDocument<Document>> watch(
            UnaryOperator<ChangeStreamIterable<Document>> options) {
        return options.apply(coll.watch().maxAwaitTime(MAX_AWAIT_MS, TimeUnit.MILLISECONDS)).cursor();
    }

    private List<Document> readResumed(
            UnaryOperator<ChangeStreamIterable<Document>> options, int count) {
        try (MongoChangeStreamCursor<ChangeStreamDocument<Document>> stream = watch(options)) {
            return describe(read(stream, count));
        }
    }

    /**
     * Reads {@code count} events, then waits one more getMore so that an extra (duplicate or stray)
     * event shows up in the output instead of passing unnoticed.
     */
    private List<ChangeStreamDocument<Document>> read(
            MongoChangeStreamCursor<ChangeStreamDocument<Document>> stream, int count) {
        List<ChangeStreamDocument<Document>> events = new ArrayList<>();
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(EVENT_DEADLINE_MS);
        while (events.size() < count) {
            ChangeStreamDocument<Document> event = stream.tryNext();
            if (event != null) {
                events.add(event);
            } else if (System.nanoTime() > deadline) {
                throw new IllegalStateException("expected " + count + " change events within "
                        + EVENT_DEADLINE_MS + " ms, got " + events.size() + ": " + describe(events));
            }
        }
        ChangeStreamDocument<Document> extra = stream.tryNext();
        if (extra != null) {
            events.add(extra);
        }
        return events;
    }

    private List<ChangeStreamDocument<Document>> readUntilInvalidate(
            MongoChangeStreamCursor<ChangeStreamDocument<Document>> stream) {
        List<ChangeStreamDocument<Document>> events = new ArrayList<>();
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(EVENT_DEADLINE_MS);
        while (events.isEmpty() || !"invalidate".equals(events.get(events.size() - 1).getOperationTypeString())) {
            ChangeStreamDocument<Document> event = stream.tryNext();
            if (event != null) {
                events.add(event);
            } else if (System.nanoTime() > deadline) {
                throw new IllegalStateException("no invalidate event within " + EVENT_DEADLINE_MS
                        + " ms after dropping the collection, got: " + describe(events));
            }
        }
        return events;
    }

    /** The driver-independent summary of events that the pytest side compares across drivers. */
    private static List<Document> describe(List<ChangeStreamDocument<Document>> events) {
        List<Document> out = new ArrayList<>();
        for (ChangeStreamDocument<Document> e : events) {
            BsonDocument key = e.getDocumentKey();
            BsonValue id = key == null ? null : key.get("_id");
            BsonDocument token = e.getResumeToken();
            BsonDocument ns = e.getNamespaceDocument();
            Document d = new Document("op", e.getOperationTypeString())
                    .append("ns", ns == null ? null : ns.getString("db").getValue() + "." + ns.getString("coll").getValue())
                    .append("id", id)
                    .append("token", token.isString("_data") ? token.getString("_data").getValue() : token.toJson())
                    .append("doc", e.getFullDocument())
                    .append("txn", e.getTxnNumber())
                    .append("lsid", e.getLsid() != null);
            if (e.getUpdateDescription() != null) {
                d.append("updated", e.getUpdateDescription().getUpdatedFields())
                        .append("removed", e.getUpdateDescription().getRemovedFields());
            }
            out.add(d);
        }
        return out;
    }
}
