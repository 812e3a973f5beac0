// A producer on Apache Kafka's own Java client, the one Kafka Connect and Flink use: it sends
// what its standard input says, so the tests can produce as a client costline did not write.
//
//   java -cp <classes>:<kafka-clients and its codecs> LinesProducer BOOTSTRAP TOPIC [CONFIG=VALUE ...]
//
// Each line of standard input is a command:
//   KEY<TAB>VALUE   send VALUE, keyed by KEY ("-" for no key: the client's own partitioner)
//   BEGIN | COMMIT | ABORT   a transaction (needs transactional.id among the configs)
//   FLUSH           wait until everything sent so far is acknowledged
// After each command it prints "LinesProducer: ok", or "LinesProducer: error <why>" when a
// send since the last answer failed, so a caller can go in step with it.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.Properties;
import java.util.concurrent.atomic.AtomicReference;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.serialization.StringSerializer;

public class LinesProducer {
    public static void main(String[] args) throws Exception {
        Properties props = new Properties();
        props.put("bootstrap.servers", args[0]);
        props.put("key.serializer", StringSerializer.class.getName());
        props.put("value.serializer", StringSerializer.class.getName());
        for (int i = 2; i < args.length; i++) {
            String[] pair = args[i].split("=", 2);
            props.put(pair[0], pair[1]);
        }
        String topic = args[1];
        boolean transactional = props.containsKey("transactional.id");
        AtomicReference<Exception> failed = new AtomicReference<>();
        BufferedReader in = new BufferedReader(
                new InputStreamReader(System.in, StandardCharsets.UTF_8));
        try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
            if (transactional) {
                producer.initTransactions();
            }
            String line;
            while ((line = in.readLine()) != null) {
                switch (line) {
                    case "BEGIN" -> producer.beginTransaction();
                    case "COMMIT" -> producer.commitTransaction();
                    case "ABORT" -> producer.abortTransaction();
                    case "FLUSH" -> producer.flush();
                    default -> {
                        String[] kv = line.split("\t", 2);
                        String key = kv[0].equals("-") ? null : kv[0];
                        producer.send(new ProducerRecord<>(topic, key, kv[1]), (meta, error) -> {
                            if (error != null) {
                                failed.compareAndSet(null, error);
                            }
                        });
                        continue;  // sends are many: no answer for each
                    }
                }
                Exception error = failed.getAndSet(null);
                System.out.println(error == null ? "LinesProducer: ok"
                        : "LinesProducer: error " + error);
                System.out.flush();
            }
        }
    }
}
