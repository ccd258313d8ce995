// Offsets and metadata as the Java client and its AdminClient ask for them (kafka-clients 3.9.1), for
// test_java_clients.py.  argv[0] is a JSON request {bootstrap, topic, timestamps: [ms...], group?, props?};
// one JSON object is printed:
//   {"beginning": {"0": o}, "end": {...}, "forTimes": {"<ts>": {"0": o|null}},       (KafkaConsumer)
//    "adminEarliest": {...}, "adminLatest": {...}, "adminForTimes": {"<ts>": {...}},  (Admin.listOffsets)
//    "describe": {"partitions": [{"p":0,"leader":1,"replicas":[1],"isr":[1]}]},      (Admin.describeTopics)
//    "groupOffsets": {"0": o} }                                   (Admin.listConsumerGroupOffsets, if group)
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ArrayNode;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.TimeUnit;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.ListOffsetsResult;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public final class JavaOffsets {
    static final ObjectMapper JSON = new ObjectMapper();

    static ObjectNode byPartition(Map<TopicPartition, Long> offsets) {
        ObjectNode out = JSON.createObjectNode();
        offsets.forEach((tp, o) -> out.put(Integer.toString(tp.partition()), o));
        return out;
    }

    static ArrayNode ids(List<Node> nodes) {
        ArrayNode out = JSON.createArrayNode();
        nodes.forEach(n -> out.add(n.id()));
        return out;
    }

    public static void main(String[] argv) throws Exception {
        JsonNode req = JSON.readTree(argv[0]);
        String topic = req.get("topic").asText();
        Properties props = new Properties();
        props.put("bootstrap.servers", req.get("bootstrap").asText());
        if (req.has("props")) {
            req.get("props").fields().forEachRemaining(e -> props.put(e.getKey(), e.getValue().asText()));
        }
        Properties consumerProps = new Properties();
        consumerProps.putAll(props);
        consumerProps.put("key.deserializer", ByteArrayDeserializer.class.getName());
        consumerProps.put("value.deserializer", ByteArrayDeserializer.class.getName());
        ObjectNode out = JSON.createObjectNode();
        Duration timeout = Duration.ofSeconds(30);
        List<TopicPartition> partitions = new ArrayList<>();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(consumerProps)) {
            for (PartitionInfo info : consumer.partitionsFor(topic, timeout)) {
                partitions.add(new TopicPartition(topic, info.partition()));
            }
            out.set("beginning", byPartition(consumer.beginningOffsets(partitions, timeout)));
            out.set("end", byPartition(consumer.endOffsets(partitions, timeout)));
            ObjectNode forTimes = out.putObject("forTimes");
            for (JsonNode ts : req.path("timestamps")) {
                Map<TopicPartition, Long> query = new HashMap<>();
                partitions.forEach(tp -> query.put(tp, ts.asLong()));
                ObjectNode answer = forTimes.putObject(ts.asText());
                consumer.offsetsForTimes(query, timeout).forEach((tp, found) -> {
                    if (found == null) {
                        answer.putNull(Integer.toString(tp.partition()));
                    } else {
                        answer.put(Integer.toString(tp.partition()), found.offset());
                    }
                });
            }
        }
        try (Admin admin = Admin.create(props)) {
            out.set("adminEarliest", listOffsets(admin, partitions, OffsetSpec.earliest()));
            out.set("adminLatest", listOffsets(admin, partitions, OffsetSpec.latest()));
            ObjectNode forTimes = out.putObject("adminForTimes");
            for (JsonNode ts : req.path("timestamps")) {
                forTimes.set(ts.asText(), listOffsets(admin, partitions, OffsetSpec.forTimestamp(ts.asLong())));
            }
            TopicDescription description = admin.describeTopics(List.of(topic)).allTopicNames()
                    .get(30, TimeUnit.SECONDS).get(topic);
            ArrayNode described = out.putObject("describe").putArray("partitions");
            for (TopicPartitionInfo info : description.partitions()) {
                ObjectNode p = described.addObject().put("p", info.partition())
                        .put("leader", info.leader() == null ? -1 : info.leader().id());
                p.set("replicas", ids(info.replicas()));
                p.set("isr", ids(info.isr()));
            }
            if (req.hasNonNull("group")) {
                ObjectNode committed = out.putObject("groupOffsets");
                Map<TopicPartition, OffsetAndMetadata> offsets = admin
                        .listConsumerGroupOffsets(req.get("group").asText())
                        .partitionsToOffsetAndMetadata().get(30, TimeUnit.SECONDS);
                offsets.forEach((tp, om) -> committed.put(Integer.toString(tp.partition()), om.offset()));
            }
        }
        System.out.println(out.toString());
    }

    static ObjectNode listOffsets(Admin admin, List<TopicPartition> partitions, OffsetSpec spec) throws Exception {
        Map<TopicPartition, OffsetSpec> query = new HashMap<>();
        partitions.forEach(tp -> query.put(tp, spec));
        ObjectNode out = JSON.createObjectNode();
        Map<TopicPartition, ListOffsetsResult.ListOffsetsResultInfo> found =
                admin.listOffsets(query).all().get(30, TimeUnit.SECONDS);
        found.forEach((tp, info) -> out.put(Integer.toString(tp.partition()), info.offset()));
        return out;
    }
}
