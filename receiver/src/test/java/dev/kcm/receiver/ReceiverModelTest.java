package dev.kcm.receiver;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.InetAddress;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Random;

import org.apache.kafka.clients.producer.MockProducer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.KafkaException;
import org.apache.kafka.common.Uuid;
import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.common.metrics.KafkaMetricsContext;
import org.apache.kafka.common.network.ClientInformation;
import org.apache.kafka.common.network.ListenerName;
import org.apache.kafka.common.protocol.ApiKeys;
import org.apache.kafka.common.requests.RequestContext;
import org.apache.kafka.common.requests.RequestHeader;
import org.apache.kafka.common.security.auth.KafkaPrincipal;
import org.apache.kafka.common.security.auth.SecurityProtocol;
import org.apache.kafka.server.telemetry.ClientTelemetryPayload;
import org.junit.jupiter.api.Test;

/**
 * Model-based test of the plugin against docs/receiver.md ("What it writes", "How it protects the broker",
 * "Configuration", "Metrics"): seeded random pushes from many clients (ids, principals, addresses, software,
 * compression magic, sizes near the queue budget, empty and broken payloads), a producer whose acknowledgements and
 * failures the test controls (so the queue fills and drains), checked against a reference written from the docs:
 * each written record's key, value and headers, what is dropped and counted where, order, the byte budget, the
 * metrics; and configuration values valid and invalid by the Configuration table.
 */
class ReceiverModelTest {
    private static final long[] SEEDS = {1, 2, 3, 4, 5, 6};
    private static final int STEPS = 250;
    private static final String[] SOFTWARE = {"apache-kafka-java", "confluent-kafka-python", "librdkafka", "unknown"};
    private static final String[] PROTOCOLS = {"PLAINTEXT", "SASL_SSL", "SSL", "SASL_PLAINTEXT"};
    private static final byte[][] MAGIC = {
        {0x28, (byte) 0xB5, 0x2F, (byte) 0xFD}, {0x04, 0x22, 0x4D, 0x18}, {0x1F, (byte) 0x8B},
        {(byte) 0x82, 'S', 'N', 'A', 'P', 'P', 'Y', 0}, {0x0A}};
    private static final String[] ENCODING = {"zstd", "lz4", "gzip", "snappy", "none"};

    /** A client as the model knows it: what the docs say its record's headers carry. */
    private record Client(Uuid instance, String clientId, String software, String version, String address, int port,
                          String principal, String protocol) {
    }

    /** An accepted push as the model expects it written. */
    private record Expected(Client client, byte[] data, boolean terminating, int interval, String encoding,
                            long weight) {
    }

    @Test
    void seededPushSequencesMatchTheDocumentedModel() throws Exception {
        for (long seed : SEEDS) {
            try {
                runSeed(seed);
            } catch (AssertionError | Exception e) {
                throw new AssertionError("seed " + seed + ": " + e.getMessage(), e);
            }
        }
    }

    private void runSeed(long seed) throws Exception {
        Random random = new Random(seed);
        long budget = 1024 + random.nextInt(6000);
        MockProducer<byte[], byte[]> producer = Fixtures.mockProducer(false);
        ReceiverCore core = new ReceiverCore(config -> producer);
        List<Client> clients = new ArrayList<>();
        for (int i = 0; i < 6; i++) {
            String software = SOFTWARE[random.nextInt(SOFTWARE.length)];
            clients.add(new Client(new Uuid(random.nextLong(), random.nextLong()),
                    "client-" + i + "-" + "x".repeat(random.nextInt(40)), software,
                    software.equals("unknown") ? "unknown" : "1." + random.nextInt(9),
                    "10.0." + random.nextInt(256) + "." + random.nextInt(256), 1024 + random.nextInt(60000),
                    "User:u" + random.nextInt(3), PROTOCOLS[random.nextInt(PROTOCOLS.length)]));
        }
        try {
            core.configure(Fixtures.brokerConfig("kcm.receiver.topic", "topic-" + seed,
                    "kcm.receiver.queue.max.bytes", String.valueOf(budget), "kcm.receiver.close.timeout.ms", "0"));
            core.contextChange(new KafkaMetricsContext("kafka.server",
                    Map.of("kafka.cluster.id", "cluster-" + seed, "kafka.node.id", "9")));
            List<Expected> accepted = new ArrayList<>();
            long held = 0;
            long received = 0;
            long bytesReceived = 0;
            long written = 0;
            long bytesWritten = 0;
            long dropped = 0;
            long empty = 0;
            long producerErrors = 0;
            long exportErrors = 0;
            int acked = 0;
            for (int step = 0; step < STEPS; step++) {
                int action = random.nextInt(10);
                if (action < 6) {
                    Client client = clients.get(random.nextInt(clients.size()));
                    int kind = random.nextInt(12);
                    received++;
                    if (kind == 0) {
                        core.export(context(client), payload(client, () -> {
                            throw new KafkaException("broken payload");
                        }, false), 1000);
                        exportErrors++;
                        continue;
                    }
                    int size = kind == 1 ? 0 : sizeNear(random, budget, client);
                    int codec = random.nextInt(MAGIC.length);
                    byte[] data = new byte[size];
                    random.nextBytes(data);
                    if (size > 0) {
                        System.arraycopy(MAGIC[codec], 0, data, 0, Math.min(size, MAGIC[codec].length));
                    }
                    boolean terminating = random.nextInt(8) == 0;
                    int interval = 1000 * (1 + random.nextInt(60));
                    core.export(context(client), payload(client, () -> ByteBuffer.wrap(data).asReadOnlyBuffer(),
                            terminating), interval);
                    bytesReceived += size;
                    // Docs: size + 256 + two bytes a character of client id, software name and version.
                    long weight = size + 256L + 2L * (client.clientId.length() + client.software.length()
                            + client.version.length());
                    if (size == 0) {
                        empty++;
                    } else if (held + weight > budget) {
                        dropped++;
                    } else {
                        held += weight;
                        String encoding = size >= MAGIC[codec].length ? ENCODING[codec] : "none";
                        accepted.add(new Expected(client, data, terminating, interval, encoding, weight));
                    }
                } else {
                    // Acknowledge or fail the oldest records the producer was handed.
                    int sent = accepted.size();
                    Fixtures.await(() -> producer.history().size() == sent);
                    int n = random.nextInt(4);
                    for (int i = 0; i < n && acked < sent; i++, acked++) {
                        Expected push = accepted.get(acked);
                        if (random.nextInt(4) == 0) {
                            assertTrue(producer.errorNext(new KafkaException("topic unavailable")));
                            producerErrors++;
                        } else {
                            assertTrue(producer.completeNext());
                            written++;
                            bytesWritten += push.data.length;
                        }
                        held -= push.weight;
                    }
                }
                if (step % 25 == 24 || step == STEPS - 1) {
                    int sent = accepted.size();
                    Fixtures.await(() -> producer.history().size() == sent);
                    assertEquals(held, count(core, "queue-bytes"), "queue-bytes at step " + step);
                    assertTrue(held <= budget);
                    assertEquals(received, count(core, "pushes-received-total"));
                    assertEquals(bytesReceived, count(core, "bytes-received-total"));
                    assertEquals(written, count(core, "pushes-written-total"));
                    assertEquals(bytesWritten, count(core, "bytes-written-total"));
                    assertEquals(dropped, count(core, "pushes-dropped-total"));
                    assertEquals(empty, count(core, "pushes-empty-total"));
                    assertEquals(producerErrors, count(core, "producer-errors-total"));
                    assertEquals(exportErrors, count(core, "export-errors-total"));
                }
            }
            // Every accepted push written once, in the order it was taken (so per client too), as the docs say.
            List<ProducerRecord<byte[], byte[]>> history = producer.history();
            assertEquals(accepted.size(), history.size());
            for (int i = 0; i < accepted.size(); i++) {
                checkRecord(seed, accepted.get(i), history.get(i));
            }
            // Once nothing is held: received = written + dropped + empty + producer and export errors.
            while (producer.completeNext()) {
                written++;
            }
            assertEquals(0, count(core, "queue-bytes"));
            assertEquals(received, written + dropped + empty + producerErrors + exportErrors);
            assertEquals(written, count(core, "pushes-written-total"));
        } finally {
            core.close();
        }
    }

    private static void checkRecord(long seed, Expected push, ProducerRecord<byte[], byte[]> record) {
        Client client = push.client;
        assertEquals("topic-" + seed, record.topic());
        String uuid = new java.util.UUID(client.instance.getMostSignificantBits(),
                client.instance.getLeastSignificantBits()).toString();
        assertEquals(uuid, new String(record.key(), StandardCharsets.UTF_8));
        assertArrayEquals(push.data, record.value());
        Map<String, String> expected = new HashMap<>();
        expected.put("content-type", "application/x-protobuf");
        expected.put("content-encoding", push.encoding);
        expected.put("client_instance_id", uuid);
        expected.put("client_id", client.clientId);
        if (!client.software.equals("unknown")) {
            expected.put("client_software_name", client.software);
        }
        if (!client.version.equals("unknown")) {
            expected.put("client_software_version", client.version);
        }
        expected.put("client_source_address", client.address);
        expected.put("client_source_port", String.valueOf(client.port));
        expected.put("principal", client.principal);
        expected.put("listener_name", client.protocol);
        expected.put("security_protocol", client.protocol);
        expected.put("broker_id", "9");
        expected.put("cluster_id", "cluster-" + seed);
        expected.put("push_interval_ms", String.valueOf(push.interval));
        expected.put("terminating", String.valueOf(push.terminating));
        assertEquals(expected, Fixtures.headers(record));
        assertEquals(expected.size(), record.headers().toArray().length, "a header written twice");
    }

    /** A size around what is left of the budget, sometimes over it: the queue fills, drops, and drains. */
    private static int sizeNear(Random random, long budget, Client client) {
        int choice = random.nextInt(4);
        if (choice == 0) {
            return 1 + random.nextInt(8);
        }
        if (choice == 1) {
            long overhead = 256L + 2L * (client.clientId.length() + client.software.length()
                    + client.version.length());
            return (int) Math.max(1, budget - overhead + random.nextInt(3) - 1);
        }
        return 1 + random.nextInt((int) budget / 3);
    }

    private static RequestContext context(Client client) throws Exception {
        String[] user = client.principal.split(":", 2);
        return new RequestContext(new RequestHeader(ApiKeys.PUSH_TELEMETRY, (short) 0, client.clientId, 7),
                "conn", InetAddress.getByName(client.address), Optional.of(client.port),
                new KafkaPrincipal(user[0], user[1]), ListenerName.normalised(client.protocol),
                SecurityProtocol.forName(client.protocol), new ClientInformation(client.software, client.version),
                false);
    }

    private static ClientTelemetryPayload payload(Client client, java.util.function.Supplier<ByteBuffer> data,
                                                  boolean terminating) {
        return new ClientTelemetryPayload() {
            @Override
            public Uuid clientInstanceId() {
                return client.instance;
            }

            @Override
            public boolean isTerminating() {
                return terminating;
            }

            @Override
            public String contentType() {
                return Fixtures.BROKER_CONTENT_TYPE;
            }

            @Override
            public ByteBuffer data() {
                return data.get();
            }
        };
    }

    private static long count(ReceiverCore core, String name) {
        return Fixtures.count(core, name);
    }

    /**
     * Configuration by the docs' table: valid values are taken, invalid ones (and unknown kcm.receiver.* keys, and a
     * refused serializer) fail with a ConfigException whose message names the key.
     */
    @Test
    void seededConfigurationsFailOrPassAsTheTableSays() {
        Random random = new Random(7);
        String[][] cases = {
            {"kcm.receiver.queue.max.bytes", "1023", "bad"}, {"kcm.receiver.queue.max.bytes", "1024", "ok"},
            {"kcm.receiver.queue.max.bytes", "-5", "bad"}, {"kcm.receiver.queue.max.bytes", "lots", "bad"},
            {"kcm.receiver.queue.max.bytes", "16777216", "ok"}, {"kcm.receiver.close.timeout.ms", "0", "ok"},
            {"kcm.receiver.close.timeout.ms", "-1", "bad"}, {"kcm.receiver.close.timeout.ms", "soon", "bad"},
            {"kcm.receiver.topic", "", "bad"}, {"kcm.receiver.topic", "m", "ok"},
            {"kcm.receiver.bootstrap.servers", "kafka-0:9092,kafka-1:9092", "ok"},
            {"kcm.receiver.bootstrap.servers", "kafka-0", "bad"},
            {"kcm.receiver.bootstrap.servers", "kafka-0:99999", "bad"},
            {"kcm.receiver.queue.max.byte", "2048", "bad"}, {"kcm.receiver.topik", "m", "bad"},
            {"kcm.receiver.producer.key.serializer",
                "org.apache.kafka.common.serialization.ByteArraySerializer", "bad"},
            {"kcm.receiver.producer.sasl.jass.config", "x", "bad"}, {"kcm.receiver.producer.linger.ms", "5", "ok"},
            {"kcm.receiver.producer.acks", "all", "ok"}, {"kcm.receiver.producer.linger.ms", "soon", "bad"},
        };
        for (int round = 0; round < 3 * cases.length; round++) {
            String[] one = cases[random.nextInt(cases.length)];
            Map<String, Object> config = Fixtures.brokerConfig(one[0], one[1]);
            String where = "seed 7 round " + round + ": " + one[0] + "=" + one[1];
            if (one[2].equals("ok")) {
                ReceiverConfig.parse(config);
            } else {
                ConfigException error = assertThrows(ConfigException.class, () -> ReceiverConfig.parse(config), where);
                // docs: start-up fails naming the property, the whole of it for a producer setting too.
                assertTrue(error.getMessage().contains(one[0]), where + ": " + error.getMessage());
            }
        }
    }
}
