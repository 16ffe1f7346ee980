package dev.kcm.clients;

import java.io.IOException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.List;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.PartitionInfo;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;
import org.apache.kafka.common.serialization.ByteArraySerializer;

/**
 * A real Java producer or consumer for tests: it runs until stdin closes (or SECONDS pass), then closes the client,
 * which sends its terminating telemetry push. Usage: TestClient producer|consumer BOOTSTRAP TOPIC CLIENT_ID SECONDS
 * (further properties in the environment variable KCM_JAVA_CONFIG, as java.util.Properties text). Prints "started"
 * once the first record is sent or the partitions are assigned. A consumer given a
 * group.id subscribes in that group (classic protocol); without one it assigns itself every partition.
 */
public final class TestClient {
    private TestClient() {
    }

    public static void main(String[] args) throws Exception {
        String role = args[0];
        Properties config = new Properties();
        config.put("bootstrap.servers", args[1]);
        String topic = args[2];
        config.put("client.id", args[3]);
        long deadline = System.nanoTime() + (long) (Double.parseDouble(args[4]) * 1e9);
        // Further properties come in the environment (java.util.Properties text), never on the command line.
        String given = System.getenv("KCM_JAVA_CONFIG");
        if (given != null) {
            config.load(new java.io.StringReader(given));
        }
        Thread stdin = new Thread(() -> {
            try {
                while (System.in.read() >= 0) {
                    continue;
                }
            } catch (IOException ignored) {
                // A broken pipe means the same as a closed one: stop.
            }
        }, "stdin-watch");
        stdin.setDaemon(true);
        stdin.start();
        if (role.equals("producer")) {
            produce(config, topic, stdin, deadline);
        } else if (role.equals("consumer")) {
            consume(config, topic, stdin, deadline);
        } else {
            System.err.println("role must be producer or consumer, not " + role);
            System.exit(2);
        }
    }

    private static boolean running(Thread stdin, long deadline) {
        return stdin.isAlive() && System.nanoTime() < deadline;
    }

    private static void produce(Properties config, String topic, Thread stdin, long deadline) throws Exception {
        config.put("key.serializer", ByteArraySerializer.class.getName());
        config.put("value.serializer", ByteArraySerializer.class.getName());
        try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(config)) {
            producer.send(new ProducerRecord<>(topic, "first".getBytes())).get();
            started();
            long sent = 0;
            while (running(stdin, deadline)) {
                producer.send(new ProducerRecord<>(topic, ("record-" + sent++).getBytes()));
                Thread.sleep(20);
            }
        }
    }

    private static void consume(Properties config, String topic, Thread stdin, long deadline) {
        config.put("key.deserializer", ByteArrayDeserializer.class.getName());
        config.put("value.deserializer", ByteArrayDeserializer.class.getName());
        boolean inGroup = config.containsKey("group.id");
        if (inGroup) {
            // The sandbox's broker holds every JoinGroup for half the session timeout, and never assigns with the
            // KIP-848 protocol: classic, with a short session, so the join takes seconds.
            config.putIfAbsent("group.protocol", "classic");
            config.putIfAbsent("session.timeout.ms", "6000");
            config.putIfAbsent("heartbeat.interval.ms", "2000");
            config.putIfAbsent("auto.offset.reset", "earliest");
        }
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(config)) {
            if (inGroup) {
                consumer.subscribe(List.of(topic), new StartedOnFirstAssignment());
            } else {
                List<TopicPartition> partitions = new ArrayList<>();
                for (PartitionInfo info : consumer.partitionsFor(topic, Duration.ofSeconds(30))) {
                    partitions.add(new TopicPartition(topic, info.partition()));
                }
                consumer.assign(partitions);
                consumer.seekToBeginning(partitions);
                started();
            }
            while (running(stdin, deadline)) {
                consumer.poll(Duration.ofMillis(100));
            }
        }
    }

    /** Prints "started" when the group first assigns this consumer its partitions. */
    private static final class StartedOnFirstAssignment implements ConsumerRebalanceListener {
        private boolean assigned;

        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
            // Nothing to commit or clean up: the records are only read.
        }

        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
            if (!assigned) {
                assigned = true;
                started();
            }
        }
    }

    private static void started() {
        System.out.println("started");
        System.out.flush();
    }
}
