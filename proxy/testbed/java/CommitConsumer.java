/*
 * A Kafka consumer for the test bed that commits the way applications do, and says so.
 *
 * Usage: java -cp <kafka-clients jars>:<classes> CommitConsumer PROPERTIES_FILE TOPIC MODE SLOW_MS
 *   MODE: async  (commitAsync of the record's offset after every record, many in flight)
 *         sync   (commitSync after every poll)
 *         auto   (enable.auto.commit=true, set in the properties)
 *   SLOW_MS: milliseconds to sleep in every partition-revocation callback (0: none).
 *
 * Prints one JSON object per line: {"name":"assigned"|"revoked"|"lost","partitions":[[t,p],..],
 * "ts":ms}, {"name":"records","records":[[t,p,offset],..],"ts":ms} (one per poll),
 * {"name":"commit","ok":bool,"error":str|null,"offsets":[[t,p,offset],..],"ts":ms} for each
 * completed asynchronous or synchronous commit, and {"name":"stopped"} after SIGTERM (the
 * consumer closes, which commits nothing by itself unless auto-commit is on).
 */
import java.io.FileInputStream;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicBoolean;

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

    private static void emit(String json) {
        synchronized (OUT) {
            System.out.println(json);
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
            items.add("[" + quote(tp.topic()) + "," + tp.partition() + "]");
        }
        return "[" + String.join(",", items) + "]";
    }

    private static String offsets(Map<TopicPartition, OffsetAndMetadata> offsets) {
        List<String> items = new ArrayList<>();
        for (Map.Entry<TopicPartition, OffsetAndMetadata> e : offsets.entrySet()) {
            items.add("[" + quote(e.getKey().topic()) + "," + e.getKey().partition() + ","
                      + e.getValue().offset() + "]");
        }
        return "[" + String.join(",", items) + "]";
    }

    private static void event(String name, Collection<TopicPartition> tps) {
        emit("{\"name\":\"" + name + "\",\"partitions\":" + partitions(tps) + ",\"ts\":"
             + System.currentTimeMillis() + "}");
    }

    private static void committed(Map<TopicPartition, OffsetAndMetadata> offsets, Exception error) {
        emit("{\"name\":\"commit\",\"ok\":" + (error == null) + ",\"error\":"
             + quote(error == null ? null : error.toString()) + ",\"offsets\":" + offsets(offsets)
             + ",\"ts\":" + System.currentTimeMillis() + "}");
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
        Thread main = Thread.currentThread();
        Runtime.getRuntime().addShutdownHook(new Thread(() -> {
            running.set(false);
            consumer.wakeup();
            try {
                main.join(20000);
            } catch (InterruptedException ignored) {
                // exiting anyway
            }
        }));
        consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
            @Override
            public void onPartitionsRevoked(Collection<TopicPartition> tps) {
                if (!tps.isEmpty() && slowMs > 0) {
                    try {
                        Thread.sleep(slowMs);
                    } catch (InterruptedException ignored) {
                        Thread.currentThread().interrupt();
                    }
                }
                event("revoked", tps);
            }

            @Override
            public void onPartitionsAssigned(Collection<TopicPartition> tps) {
                event("assigned", tps);
            }

            @Override
            public void onPartitionsLost(Collection<TopicPartition> tps) {
                event("lost", tps);
            }
        });
        emit("{\"name\":\"started\"}");
        try {
            while (running.get()) {
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(200));
                if (records.isEmpty()) {
                    continue;
                }
                List<String> seen = new ArrayList<>();
                Map<TopicPartition, OffsetAndMetadata> last = new java.util.HashMap<>();
                for (ConsumerRecord<byte[], byte[]> r : records) {
                    seen.add("[" + quote(r.topic()) + "," + r.partition() + "," + r.offset() + "]");
                    TopicPartition tp = new TopicPartition(r.topic(), r.partition());
                    OffsetAndMetadata next = new OffsetAndMetadata(r.offset() + 1);
                    last.put(tp, next);
                    if (mode.equals("async")) {
                        consumer.commitAsync(Map.of(tp, next), CommitConsumer::committed);
                    }
                }
                emit("{\"name\":\"records\",\"records\":[" + String.join(",", seen) + "],\"ts\":"
                     + System.currentTimeMillis() + "}");
                if (mode.equals("sync")) {
                    try {
                        consumer.commitSync(last);
                        committed(last, null);
                    } catch (Exception e) {
                        committed(last, e);
                    }
                }
            }
        } catch (WakeupException e) {
            // shutting down
        } finally {
            try {
                consumer.close(Duration.ofSeconds(10));
            } finally {
                emit("{\"name\":\"stopped\"}");
            }
        }
    }
}
