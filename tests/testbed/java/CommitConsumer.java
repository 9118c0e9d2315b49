/*
 * A Kafka consumer for the test bed that commits the way applications do, and says so.
 *
 * Usage: java -cp <kafka-clients jars>:<classes> CommitConsumer PROPERTIES_FILE TOPIC MODE SLOW_MS
 *   MODE: async  (commitAsync of the record's offset after every record, many in flight)
 *         sync   (commitSync after every poll)
 *         auto   (enable.auto.commit=true)
 *   SLOW_MS: milliseconds to sleep in every partition-revocation callback (0: none).
 *
 * Reads commands from stdin, one a line: "stall SECONDS" blocks the poll loop once, after the
 * records of the current poll are processed and before they are committed (a member that
 * overruns max.poll.interval.ms); "stop" closes the consumer gracefully (as SIGTERM does).
 *
 * Prints one JSON object a line; "t" is System.nanoTime() in seconds, which on Linux is
 * CLOCK_MONOTONIC like Python's time.monotonic(), so times compare across processes:
 *   {"e":"join"}, {"e":"stall"}/{"e":"resume"} around a rebalance callback,
 *   {"e":"assign"|"revoke"|"lost","p":[partitions]}, {"e":"c","r":[[p,lo,hi],..]} (consumed),
 *   {"e":"commit","ok":bool,"err":str|null,"o":[[p,offset],..]} (each completed commit),
 *   {"e":"stuck","s":seconds}/{"e":"unstuck"}, {"e":"leave"}, {"e":"closed"}.
 */
import java.io.BufferedReader;
import java.io.FileInputStream;
import java.io.InputStreamReader;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.TreeMap;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.errors.WakeupException;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class CommitConsumer {
    private static final Object OUT = new Object();

    private static double now() {
        return System.nanoTime() / 1e9;
    }

    private static void emit(String kind, String rest) {
        String line = "{\"t\":" + now() + ",\"e\":\"" + kind + "\"" + rest + "}";
        synchronized (OUT) {
            System.out.println(line);
            System.out.flush();
        }
    }

    private static String quote(String s) {
        if (s == null) {
            return "null";
        }
        StringBuilder b = new StringBuilder("\"");
        for (char c : s.toCharArray()) {
            if (c == '"' || c == '\\') {
                b.append('\\').append(c);
            } else if (c < 0x20) {
                b.append(String.format("\\u%04x", (int) c));
            } else {
                b.append(c);
            }
        }
        return b.append('"').toString();
    }

    private static String partitions(Collection<TopicPartition> tps) {
        List<String> items = new ArrayList<>();
        for (TopicPartition tp : tps) {
            items.add(Integer.toString(tp.partition()));
        }
        return ",\"p\":[" + String.join(",", items) + "]";
    }

    private static void committed(Map<TopicPartition, OffsetAndMetadata> offsets, Exception error) {
        committed(offsets, error, now());
    }

    /** A commit's outcome; {@code sent} is when it was sent (its callback may come later). */
    private static void committed(Map<TopicPartition, OffsetAndMetadata> offsets, Exception error,
                                  double sent) {
        List<String> items = new ArrayList<>();
        if (offsets != null) {  // the client passes null offsets with some failures
            for (Map.Entry<TopicPartition, OffsetAndMetadata> e : offsets.entrySet()) {
                items.add("[" + e.getKey().partition() + "," + e.getValue().offset() + "]");
            }
        }
        emit("commit", ",\"ok\":" + (error == null && offsets != null) + ",\"err\":"
             + quote(error == null ? null : error.toString()) + ",\"o\":["
             + String.join(",", items) + "],\"sent\":" + sent);
    }

    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        try (FileInputStream in = new FileInputStream(args[0])) {
            props.load(in);
        }
        String topic = args[1];
        String mode = args[2];
        long slowMs = Long.parseLong(args[3]);
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        props.put("enable.auto.commit", mode.equals("auto") ? "true" : "false");
        KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props);
        AtomicBoolean running = new AtomicBoolean(true);
        AtomicLong stallMs = new AtomicLong(0);
        Thread main = Thread.currentThread();
        Runnable stop = () -> {
            running.set(false);
            consumer.wakeup();
        };
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            stop.run();
            try {
                main.join(20000);
            } catch (InterruptedException ignored) {
                // exiting anyway
            }
        }));
        Thread commands = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in))) {
                String line;
                while ((line = in.readLine()) != null) {
                    String[] words = line.trim().split("\\s+");
                    if (words[0].equals("stall") && words.length > 1) {
                        stallMs.set((long) (Double.parseDouble(words[1]) * 1000));
                    } else if (words[0].equals("stop")) {
                        stop.run();
                    }
                }
            } catch (Exception ignored) {
                // stdin closed
            }
        });
        commands.setDaemon(true);
        commands.start();
        consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
            @Override
            public void onPartitionsRevoked(Collection<TopicPartition> tps) {
                emit("stall", "");
                emit("revoke", partitions(tps));
                if (!tps.isEmpty() && slowMs > 0) {
                    try {
                        Thread.sleep(slowMs);
                    } catch (InterruptedException ignored) {
                        Thread.currentThread().interrupt();
                    }
                }
                emit("resume", "");
            }

            @Override
            public void onPartitionsAssigned(Collection<TopicPartition> tps) {
                emit("stall", "");
                emit("assign", partitions(tps));
                emit("resume", "");
            }

            @Override
            public void onPartitionsLost(Collection<TopicPartition> tps) {
                emit("stall", "");
                emit("lost", partitions(tps));
                emit("resume", "");
            }
        });
        emit("join", "");
        try {
            while (running.get()) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(200));
                if (records.isEmpty()) {
                    continue;
                }
                TreeMap<Integer, List<long[]>> ranges = new TreeMap<>();
                Map<TopicPartition, OffsetAndMetadata> last = new HashMap<>();
                List<Map<TopicPartition, OffsetAndMetadata>> each = new ArrayList<>();
                for (ConsumerRecord<byte[], byte[]> r : records) {
                    List<long[]> runs = ranges.computeIfAbsent(r.partition(), k -> new ArrayList<>());
                    if (!runs.isEmpty() && runs.get(runs.size() - 1)[1] + 1 == r.offset()) {
                        runs.get(runs.size() - 1)[1] = r.offset();
                    } else {
                        runs.add(new long[] {r.offset(), r.offset()});
                    }
                    TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                    OffsetAndMetadata next = new OffsetAndMetadata(r.offset() + 1);
                    last.put(tp, next);
                    each.add(Map.of(tp, next));
                }
                List<String> items = new ArrayList<>();
                for (Map.Entry<Integer, List<long[]>> e : ranges.entrySet()) {
                    for (long[] run : e.getValue()) {
                        items.add("[" + e.getKey() + "," + run[0] + "," + run[1] + "]");
                    }
                }
                emit("c", ",\"r\":[" + String.join(",", items) + "]");
                long stall = stallMs.getAndSet(0);
                if (stall > 0) {
                    emit("stuck", ",\"s\":" + (stall / 1000.0));
                    Thread.sleep(stall);
                    emit("unstuck", "");
                }
                if (mode.equals("async")) {
                    for (Map<TopicPartition, OffsetAndMetadata> one : each) {
                        double sent = now();
                        consumer.commitAsync(one, (offsets, error) -> committed(offsets, error, sent));
                    }
                } else if (mode.equals("sync")) {
                    double sent = now();
                    try {
                        consumer.commitSync(last);
                        committed(last, null, sent);
                    } catch (Exception e) {
                        committed(last, e, sent);
                    }
                    if (now() - sent >= 1.0) {  // the poll loop was held: report it as stuck
                        emit("blocked", ",\"since\":" + sent);
                    }
                }
            }
        } catch (WakeupException e) {
            // shutting down
        } finally {
            emit("leave", "");
            try {
                consumer.close(Duration.ofSeconds(10));
            } finally {
                emit("closed", "");
            }
        }
    }
}
