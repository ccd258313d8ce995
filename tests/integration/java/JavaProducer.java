// The Apache Kafka Java client (kafka-clients 3.9.1) as the client matrix (tests/integration/clients) drives
// its producer and its metadata: a JSON request in argv[0], one JSON object a line on stdout.
//   {"op":"produce","bootstrap","topic","records":[{"k":b64|null,"v":b64,"h":[[name,b64]...]}...],"props"}
//     sends every record (key-hashed partitions), waits for every acknowledgement, then prints
//     {"type":"done","count":N,"errors":[...]}; a failed send is listed, not retried
//   {"op":"topics","bootstrap"}
//     prints {"type":"topics","topics":{"name":partitions,...}} from a Metadata request (listTopics)
import com.fasterxml.jackson.databind.JsonNode;
import com.fasterxml.jackson.databind.ObjectMapper;
import com.fasterxml.jackson.databind.node.ObjectNode;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.Collections;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.Future;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public final class JavaProducer {
    static final ObjectMapper JSON = new ObjectMapper();

    static byte[] unb64(JsonNode node) {
        return node == null || node.isNull() ? null : Base64.getDecoder().decode(node.asText());
    }

    public static void main(String[] argv) throws Exception {
        JsonNode req = JSON.readTree(argv[0]);
        Properties props = new Properties();
        props.put("bootstrap.servers", req.get("bootstrap").asText());
        if (req.has("props")) {
            req.get("props").fields().forEachRemaining(e -> props.put(e.getKey(), e.getValue().asText()));
        }
        String op = req.get("op").asText();
        if (op.equals("produce")) {
            produce(req, props);
        } else if (op.equals("topics")) {
            topics(props);
        } else {
            throw new IllegalArgumentException("unknown op " + op);
        }
    }

    static void produce(JsonNode req, Properties props) throws Exception {
        props.put("key.serializer", ByteArraySerializer.class.getName());
        props.put("value.serializer", ByteArraySerializer.class.getName());
        props.putIfAbsent("linger.ms", "5");
        props.putIfAbsent("request.timeout.ms", "20000");
        props.putIfAbsent("delivery.timeout.ms", "40000");
        String topic = req.get("topic").asText();
        List<Future<RecordMetadata>> sent = new ArrayList<>();
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
            for (JsonNode r : req.get("records")) {
                ProducerRecord<byte[], byte[]> record = new ProducerRecord<>(topic, unb64(r.get("k")), unb64(r.get("v")));
                for (JsonNode h : r.path("h")) {
                    record.headers().add(h.get(0).asText(), unb64(h.get(1)));
                }
                sent.add(producer.send(record));
            }
            producer.flush();
        }
        ObjectNode done = JSON.createObjectNode().put("type", "done").put("count", sent.size());
        var errors = done.putArray("errors");
        for (Future<RecordMetadata> f : sent) {
            try {
                f.get();
            } catch (Exception exc) {
                errors.add(exc.toString());
            }
        }
        System.out.println(done);
    }

    static void topics(Properties props) {
        props.put("key.deserializer", ByteArrayDeserializer.class.getName());
        props.put("value.deserializer", ByteArrayDeserializer.class.getName());
        ObjectNode line = JSON.createObjectNode().put("type", "topics");
        ObjectNode topics = line.putObject("topics");
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            Map<String, List<PartitionInfo>> all = consumer.listTopics(Duration.ofSeconds(30));
            for (Map.Entry<String, List<PartitionInfo>> e : all.entrySet()) {
                topics.put(e.getKey(), (e.getValue() == null ? Collections.emptyList() : e.getValue()).size());
            }
        }
        System.out.println(line);
    }
}
