package mongocdc.compat;

import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.IOException;
import java.io.InputStreamReader;
import java.io.OutputStream;
import java.io.Reader;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.nio.file.StandardOpenOption;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.atomic.AtomicReference;

import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;

import io.debezium.engine.ChangeEvent;
import io.debezium.engine.DebeziumEngine;
import io.debezium.engine.format.JsonByteArray;

/**
 * Runs the Debezium MongoDB connector embedded (DebeziumEngine, Kafka's JsonConverter) and writes every
 * record it produces, in delivery order, as one JSON line to a file:
 * {"topic": ..., "key": "<key bytes as text>" | null, "value": "<value bytes as text>" | null}.
 *
 * <p>Usage: {@code DebeziumRun <connector.properties> <records.jsonl>}. The properties are the engine's and
 * the connector's (name, connector.class, offsets file, converter.schemas.enable, ...). The caller decides
 * when to stop: the engine runs until standard input reaches its end (or a line "stop"), then closes,
 * which commits the offsets and exits with 0. A connector failure exits with 1 and its message on stderr.
 * Each line is flushed as soon as it is written, so the caller can follow the file while the engine runs.
 */
public final class DebeziumRun {
    private static final ObjectMapper JSON = new ObjectMapper();

    private DebeziumRun() {
    }

    public static void main(String[] args) throws Exception {
        if (args.length != 2) {
            System.err.println("usage: DebeziumRun <connector.properties> <records.jsonl>");
            System.exit(2);
        }
        Properties props = new Properties();
        try (Reader reader = new InputStreamReader(new FileInputStream(args[0]), StandardCharsets.UTF_8)) {
            props.load(reader);
        }
        Path output = Path.of(args[1]);
        AtomicReference<String> failure = new AtomicReference<>();
        CountDownLatch done = new CountDownLatch(1);
        try (OutputStream out = Files.newOutputStream(output, StandardOpenOption.CREATE,
                StandardOpenOption.TRUNCATE_EXISTING, StandardOpenOption.WRITE)) {
            DebeziumEngine<ChangeEvent<byte[], byte[]>> engine = DebeziumEngine.create(JsonByteArray.class)
                    .using(props)
                    .notifying(record -> write(out, record))
                    .using((success, message, error) -> {
                        if (!success) {
                            failure.set(message + (error != null ? ": " + error : ""));
                        }
                        done.countDown();
                    })
                    .build();
            ExecutorService executor = Executors.newSingleThreadExecutor();
            executor.execute(engine);
            Thread stopper = new Thread(() -> {
                waitForStop();
                try {
                    engine.close();
                }
                catch (IOException e) {
                    failure.compareAndSet(null, "closing the engine failed: " + e);
                    done.countDown();
                }
            }, "stdin-stop");
            stopper.setDaemon(true);
            stopper.start();
            done.await();
            executor.shutdown();
        }
        if (failure.get() != null) {
            System.err.println("debezium failed: " + failure.get());
            System.exit(1);
        }
        System.exit(0);
    }

    /** Blocks until standard input ends or says "stop". */
    private static void waitForStop() {
        try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
            String line;
            while ((line = in.readLine()) != null) {
                if (line.trim().equals("stop")) {
                    return;
                }
            }
        }
        catch (IOException e) {
            // an unreadable stdin means the caller is gone: stop as if it had said so
        }
    }

    private static void write(OutputStream out, ChangeEvent<byte[], byte[]> record) {
        ObjectNode line = JSON.createObjectNode();
        line.put("topic", record.destination());
        line.put("key", text(record.key()));
        line.put("value", text(record.value()));
        try {
            synchronized (out) {
                out.write(JSON.writeValueAsBytes(line));
                out.write('\n');
                out.flush();
            }
        }
        catch (IOException e) {
            throw new IllegalStateException("cannot write a record: " + e, e);
        }
    }

    private static String text(byte[] bytes) {
        return bytes == null ? null : new String(bytes, StandardCharsets.UTF_8);
    }
}
