// The Apache Kafka Java client (kafka-clients 3.9.1) as test_java_clients.py drives it: one consumer,
// configured by a JSON request in argv[0], printing one JSON object a line on stdout:
//   {"type":"assigned","partitions":[0,1]}           after each (re)assignment (group mode)
//   {"type":"revoked","partitions":[0,1]}
//   {"type":"record","p":0,"o":12,"ts":...,"tstype":"CreateTime","k":b64|null,"v":b64|null,
//    "h":[[name,b64|null]...],"epoch":-1}            leader epoch -1 = none in the batch
//   {"type":"commit","error":null|"..."}            after each commitSync (group mode, "commit": true)
//   {"type":"done","positions":{"0":200},"count":N}
// Request keys: bootstrap, topic, group (absent: assign mode), partitions (assign mode; default all),
// seek: {"0": offset, ...} or "beginning" (assign mode) | seekEpoch: {"0": [offset, epoch]} (seek with a
// leader epoch, which makes the client validate the position with OffsetsForLeaderEpoch), count (stop
// after this many records), untilEnd (stop once every partition reached the end offset read at start),
// idleMs (stop after this long without a record), pollSleepMs (a slow member), commit, props,
// metadataMs (how long to wait for the topic's partitions; default 30000).
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collection;
import java.util.HashMap;
import java.util.Iterator;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.ConsumerRecords;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class JavaConsumer {
    static final ObjectMapper JSON = new ObjectMapper();

    static synchronized void emit(ObjectNode line) {
        System.out.println(line.toString());
        System.out.flush();
    }

    static String b64(byte[] data) {
        return data == null ? null : Base64.getEncoder().encodeToString(data);
    }

    static ArrayNode partitionList(Collection<TopicPartition> partitions) {
        ArrayNode out = JSON.createArrayNode();
        partitions.stream().map(TopicPartition::partition).sorted().forEach(out::add);
        return out;
    }

    public static void main(String[] argv) throws Exception {
        JsonNode req = JSON.readTree(argv[0]);
        String topic = req.get("topic").asText();
        boolean groupMode = req.hasNonNull("group");
        Properties props = new Properties();
        props.put("bootstrap.servers", req.get("bootstrap").asText());
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        props.put("enable.auto.commit", "false");
        props.put("auto.offset.reset", "earliest");
        if (!req.path("props").path("group.protocol").asText("classic").equals("consumer")) {
            props.put("session.timeout.ms", "6000");  // KIP-848's protocol refuses these client settings
            props.put("heartbeat.interval.ms", "1000");
        }
        props.put("fetch.max.wait.ms", "100");
        if (groupMode) {
            props.put("group.id", req.get("group").asText());
        }
        if (req.has("props")) {
            req.get("props").fields().forEachRemaining(e -> props.put(e.getKey(), e.getValue().asText()));
        }
        long count = req.path("count").asLong(Long.MAX_VALUE);
        long idleMs = req.path("idleMs").asLong(30000);
        long pollSleepMs = req.path("pollSleepMs").asLong(0);
        boolean commit = req.path("commit").asBoolean(false);
        long seen = 0;

        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            List<TopicPartition> all = new ArrayList<>();
            Duration metadataWait = Duration.ofMillis(req.path("metadataMs").asLong(30000));
            for (PartitionInfo info : consumer.partitionsFor(topic, metadataWait)) {
                if (!req.has("partitions") || containsInt(req.get("partitions"), info.partition())) {
                    all.add(new TopicPartition(topic, info.partition()));
                }
            }
            Map<TopicPartition, Long> ends = req.path("untilEnd").asBoolean(false)
                    ? consumer.endOffsets(all, Duration.ofSeconds(30)) : null;
            if (groupMode) {
                consumer.subscribe(List.of(topic), new ConsumerRebalanceListener() {
                    @Override
                    public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
                        ObjectNode line = JSON.createObjectNode().put("type", "revoked");
                        line.set("partitions", partitionList(partitions));
                        emit(line);
                    }

                    @Override
                    public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
                        ObjectNode line = JSON.createObjectNode().put("type", "assigned");
                        line.set("partitions", partitionList(partitions));
                        emit(line);
                    }
                });
            } else {
                consumer.assign(all);
                JsonNode seek = req.path("seek");
                if (seek.isTextual() && seek.asText().equals("beginning")) {
                    consumer.seekToBeginning(all);
                } else if (seek.isObject()) {
                    seek.fields().forEachRemaining(e -> consumer.seek(
                            new TopicPartition(topic, Integer.parseInt(e.getKey())), e.getValue().asLong()));
                }
                req.path("seekEpoch").fields().forEachRemaining(e -> consumer.seek(
                        new TopicPartition(topic, Integer.parseInt(e.getKey())),
                        new OffsetAndMetadata(e.getValue().get(0).asLong(),
                                Optional.of(e.getValue().get(1).asInt()), "")));
            }
            long lastRecord = System.currentTimeMillis();
            while (seen < count) {
                if (ends != null && reachedEnd(consumer, ends)) {
                    break;
                }
                ConsumerRecords<byte[], byte[]> records = consumer.poll(Duration.ofMillis(200));
                for (ConsumerRecord<byte[], byte[]> r : records) {
                    emit(recordLine(r));
                    seen++;
                    lastRecord = System.currentTimeMillis();
                }
                if (commit && !records.isEmpty()) {
                    ObjectNode line = JSON.createObjectNode().put("type", "commit");
                    try {
                        consumer.commitSync(Duration.ofSeconds(30));
                        line.putNull("error");
                    } catch (RuntimeException exc) {
                        line.put("error", exc.toString());  // e.g. a rebalance under way: at least once
                    }
                    emit(line);
                }
                if (System.currentTimeMillis() - lastRecord > idleMs) {
                    break;
                }
                if (pollSleepMs > 0 && !records.isEmpty()) {
                    Thread.sleep(pollSleepMs);
                }
            }
            ObjectNode done = JSON.createObjectNode().put("type", "done").put("count", seen);
            ObjectNode positions = done.putObject("positions");
            for (TopicPartition tp : consumer.assignment()) {
                positions.put(Integer.toString(tp.partition()), consumer.position(tp, Duration.ofSeconds(30)));
            }
            emit(done);
        }
    }

    static boolean containsInt(JsonNode array, int value) {
        for (JsonNode n : array) {
            if (n.asInt() == value) {
                return true;
            }
        }
        return false;
    }

    static boolean reachedEnd(KafkaConsumer<byte[], byte[]> consumer, Map<TopicPartition, Long> ends) {
        for (Map.Entry<TopicPartition, Long> e : ends.entrySet()) {
            if (consumer.position(e.getKey(), Duration.ofSeconds(30)) < e.getValue()) {
                return false;
            }
        }
        return true;
    }

    static ObjectNode recordLine(ConsumerRecord<byte[], byte[]> r) {
        ObjectNode line = JSON.createObjectNode().put("type", "record").put("p", r.partition())
                .put("o", r.offset()).put("ts", r.timestamp()).put("tstype", r.timestampType().name)
                .put("k", b64(r.key())).put("v", b64(r.value()))
                .put("epoch", r.leaderEpoch().orElse(-1));
        ArrayNode headers = line.putArray("h");
        for (Header h : r.headers()) {
            headers.addArray().add(h.key()).add(b64(h.value()));
        }
        return line;
    }
}
