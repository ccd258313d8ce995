// The cold-path benchmark's Java client (bench/cold.py --java): the Apache Kafka Java consumer
// (kafka-clients 3.9.1) reading every record of a topic, from the beginning to the end offsets it reads
// at start, in assign mode, counting records and key + value bytes and doing nothing else with them.
// Prints one JSON line: {"records":N,"bytes":B,"seconds":S} (S: from the first poll to the last record).
// Usage: JavaReadAll BOOTSTRAP TOPIC [key=value consumer properties...]
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class JavaReadAll {
    static final long STALL_NANOS = 60_000_000_000L;

    public static void main(String[] argv) throws Exception {
        String bootstrap = argv[0];
        String topic = argv[1];
        Properties props = new Properties();
        props.put("bootstrap.servers", bootstrap);
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        props.put("enable.auto.commit", "false");
        props.put("max.poll.records", "10000");
        for (int i = 2; i < argv.length; i++) {
            String[] kv = argv[i].split("=", 2);
            props.put(kv[0], kv[1]);
        }
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            List<TopicPartition> partitions = new ArrayList<>();
            for (PartitionInfo info : consumer.partitionsFor(topic, Duration.ofSeconds(30))) {
                partitions.add(new TopicPartition(topic, info.partition()));
            }
            consumer.assign(partitions);
            consumer.seekToBeginning(partitions);
            Map<TopicPartition, Long> ends = consumer.endOffsets(partitions, Duration.ofSeconds(30));
            Set<TopicPartition> left = new HashSet<>();
            for (TopicPartition tp : partitions) {
                if (consumer.position(tp, Duration.ofSeconds(30)) < ends.get(tp)) {
                    left.add(tp);
                }
            }
            long records = 0;
            long bytes = 0;
            long started = System.nanoTime();
            long last = started;
            long progress = started;
            while (!left.isEmpty()) {
                ConsumerRecords<byte[], byte[]> batch = consumer.poll(Duration.ofMillis(200));
                for (ConsumerRecord<byte[], byte[]> r : batch) {
                    records++;
                    bytes += (r.key() == null ? 0 : r.key().length) + (r.value() == null ? 0 : r.value().length);
                }
                long now = System.nanoTime();
                if (!batch.isEmpty()) {
                    last = now;
                    progress = now;
                } else if (now - progress > STALL_NANOS) {
                    System.err.println("JavaReadAll: no record for 60 s with " + left + " not at their end");
                    System.exit(2);
                }
                left.removeIf(tp -> consumer.position(tp) >= ends.get(tp));
            }
            System.out.printf("{\"records\":%d,\"bytes\":%d,\"seconds\":%.6f}%n", records, bytes,
                              (last - started) / 1e9);
        }
    }
}
