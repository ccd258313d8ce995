// A Flink backfill through ksi: a KafkaSource that reads a topic from its earliest offset (served by ksi
// from the Iceberg table below the broker's log start) and either stops at the offsets that were the
// end when the job started (--mode bounded, the default: a backfill that finishes) or keeps reading new
// records as they arrive (--mode unbounded: a backfill that turns into the live job).
//
// Each record leaves as one JSON line {"p":partition,"o":offset,"ts":timestamp,"k":key,"v":value}
// (key and value base64) through Flink's PrintSink: replace deserialize() and the sink with your own
// decoding and your own sink (Iceberg, JDBC, files ...).  See README.md beside this file for how to build
// it and run it on a Flink cluster, and which KafkaSource settings matter with ksi.
//
//   flink run -c KsiBackfill ksi-backfill.jar --bootstrap ksi-host:9192 --topic orders [--mode unbounded]
import java.util.Base64;
import org.apache.flink.api.common.eventtime.WatermarkStrategy;
import org.apache.flink.api.common.typeinfo.TypeInformation;
import org.apache.flink.api.common.typeinfo.Types;
import org.apache.flink.connector.kafka.source.KafkaSource;
import org.apache.flink.connector.kafka.source.KafkaSourceBuilder;
import org.apache.flink.connector.kafka.source.enumerator.initializer.OffsetsInitializer;
import org.apache.flink.connector.kafka.source.reader.deserializer.KafkaRecordDeserializationSchema;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.functions.sink.PrintSink;
import org.apache.flink.util.Collector;
import org.apache.flink.util.ParameterTool;
import org.apache.kafka.clients.consumer.ConsumerRecord;

public final class KsiBackfill {

    /** The source: every partition of {@code topic}, from the earliest offset the lake holds. */
    public static KafkaSource<String> source(String bootstrap, String topic, boolean bounded) {
        KafkaSourceBuilder<String> builder = KafkaSource.<String>builder()
                // ksi's bootstrap port; ksi rewrites every broker address so all traffic stays on ksi.
                .setBootstrapServers(bootstrap)
                .setTopics(topic)
                // EARLIEST is answered by ksi with the lake's first offset, not the broker's log start.
                .setStartingOffsets(OffsetsInitializer.earliest())
                .setDeserializer(new JsonLines())
                // No consumer group is needed: KafkaSource assigns partitions itself and keeps offsets
                // in Flink's checkpoints.  (With setGroupId it also commits them on checkpoints.)
                .setClientIdPrefix("ksi-backfill")
                // Cold batches are encoded by ksi up to 256 KiB; larger fetches take more of a partition's
                // history per round trip (ksi honours both limits, always returning at least one batch).
                .setProperty("max.partition.fetch.bytes", Integer.toString(8 << 20))
                .setProperty("fetch.max.bytes", Integer.toString(64 << 20));
        if (bounded) {
            // LATEST is asked once, when the job starts: the job reads up to there and finishes.
            builder.setBounded(OffsetsInitializer.latest());
        } else {
            // New partitions of the topic are picked up every 10 s (Metadata through ksi).
            builder.setProperty("partition.discovery.interval.ms", "10000");
        }
        return builder.build();
    }

    /** One record as a JSON line; put your own decoding here. */
    static final class JsonLines implements KafkaRecordDeserializationSchema<String> {
        @Override
        public void deserialize(ConsumerRecord<byte[], byte[]> record, Collector<String> out) {
            out.collect("{\"p\":" + record.partition() + ",\"o\":" + record.offset() + ",\"ts\":"
                    + record.timestamp() + ",\"k\":" + b64(record.key()) + ",\"v\":" + b64(record.value()) + "}");
        }

        @Override
        public TypeInformation<String> getProducedType() {
            return Types.STRING;
        }

        private static String b64(byte[] data) {
            return data == null ? "null" : "\"" + Base64.getEncoder().encodeToString(data) + "\"";
        }
    }

    public static void main(String[] args) throws Exception {
        ParameterTool params = ParameterTool.fromArgs(args);
        String topic = params.getRequired("topic");
        boolean bounded = !"unbounded".equals(params.get("mode", "bounded"));
        StreamExecutionEnvironment env = StreamExecutionEnvironment.getExecutionEnvironment();
        env.fromSource(source(params.getRequired("bootstrap"), topic, bounded),
                        WatermarkStrategy.noWatermarks(), "ksi " + topic)
                .sinkTo(new PrintSink<>());
        env.execute("ksi backfill of " + topic);
    }
}
