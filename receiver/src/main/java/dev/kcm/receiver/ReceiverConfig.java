package dev.kcm.receiver;

import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Set;
import java.util.TreeSet;

import org.apache.kafka.clients.CommonClientConfigs;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.common.config.AbstractConfig;
import org.apache.kafka.common.config.ConfigDef;
import org.apache.kafka.common.config.ConfigDef.Importance;
import org.apache.kafka.common.config.ConfigDef.Type;
import org.apache.kafka.common.config.ConfigException;
import org.apache.kafka.common.config.SaslConfigs;
import org.apache.kafka.common.config.types.Password;
import org.apache.kafka.common.errors.InvalidTopicException;
import org.apache.kafka.common.internals.Topic;
import org.apache.kafka.common.security.JaasContext;
import org.apache.kafka.common.serialization.ByteArraySerializer;
import org.apache.kafka.common.utils.Utils;

/** The plugin's settings: broker properties prefixed {@code kcm.receiver.}, parsed once at start-up. */
public final class ReceiverConfig {
    public static final String PREFIX = "kcm.receiver.";
    public static final String TOPIC = PREFIX + "topic";
    public static final String BOOTSTRAP_SERVERS = PREFIX + "bootstrap.servers";
    public static final String QUEUE_MAX_BYTES = PREFIX + "queue.max.bytes";
    public static final String CLOSE_TIMEOUT_MS = PREFIX + "close.timeout.ms";
    public static final String PRODUCER_PREFIX = PREFIX + "producer.";
    /** A broker key under this prefix but not {@link #PREFIX} has a misspelt prefix: {@code kcm.reciever.topic}. */
    static final String FAMILY_PREFIX = "kcm.";
    /**
     * The broker's own limit on a push's size, KIP-714 (Kafka 4.3.1 checks it after decompression too, earlier
     * versions the compressed payload only); Kafka's default is 1 MiB.
     */
    static final String TELEMETRY_MAX_BYTES = "telemetry.max.bytes";
    static final long KAFKA_DEFAULT_TELEMETRY_MAX_BYTES = 1024 * 1024; // ServerConfigs.TELEMETRY_MAX_BYTES_DEFAULT

    public static final String DEFAULT_TOPIC = "kafka-client-metrics";
    public static final long DEFAULT_QUEUE_MAX_BYTES = 16L * 1024 * 1024;
    static final int DEFAULT_MAX_REQUEST_BYTES = 1024 * 1024; // the producer's own default max.request.size
    static final String KAFKA_DEFAULT_LISTENERS = "PLAINTEXT://:9092"; // SocketServerConfigs.LISTENERS_DEFAULT
    // While the metrics cluster is unreachable, Kafka's defaults (reconnect 50 ms doubling to 1 s, and a rebootstrap
    // whenever no node is connectable) put ~9,000 WARN and more INFO lines an hour into the broker's log: reconnects
    // back off 1 s doubling to 30 s instead, and the bootstrap is not redone (each one logs INFO).
    static final long DEFAULT_RECONNECT_BACKOFF_MS = 1_000;
    static final long DEFAULT_RECONNECT_BACKOFF_MAX_MS = 30_000;
    static final String DEFAULT_METADATA_RECOVERY_STRATEGY = "none";

    // The serializers are the plugin's business: records are built as bytes.
    private static final Set<String> FIXED_PRODUCER_KEYS = Set.of(
            ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG);

    static final ConfigDef DEFINITION = new ConfigDef()
            .define(TOPIC, Type.STRING, DEFAULT_TOPIC, ReceiverConfig::checkTopic, Importance.HIGH,
                    "Topic every client push is written to (metrics-topic contract v1).")
            .define(BOOTSTRAP_SERVERS, Type.LIST, "", Importance.MEDIUM,
                    "Where the internal producer connects; empty: this broker's own inter-broker listener.")
            .define(QUEUE_MAX_BYTES, Type.LONG, DEFAULT_QUEUE_MAX_BYTES, ConfigDef.Range.atLeast(1024),
                    Importance.MEDIUM, "Bytes of pushes held while the producer catches up; pushes beyond are dropped and counted.")
            .define(CLOSE_TIMEOUT_MS, Type.LONG, 5000L, ConfigDef.Range.atLeast(0), Importance.LOW,
                    "How long shutdown waits for queued pushes to be written.");

    public final String topic;
    public final long queueMaxBytes;
    public final long closeTimeoutMs;
    public final Map<String, Object> producerConfig;
    /** {@code kcm.receiver.producer.*} names Kafka's producer does not know: passed on for its plugins, warned of. */
    public final List<String> unknownProducerKeys;

    private ReceiverConfig(String topic, long queueMaxBytes, long closeTimeoutMs, Map<String, Object> producerConfig,
                           List<String> unknownProducerKeys) {
        this.topic = topic;
        this.queueMaxBytes = queueMaxBytes;
        this.closeTimeoutMs = closeTimeoutMs;
        this.producerConfig = producerConfig;
        this.unknownProducerKeys = unknownProducerKeys;
    }

    /** Parses the broker's properties; throws ConfigException naming the bad property. */
    public static ReceiverConfig parse(Map<String, ?> brokerConfig) {
        Map<String, Object> own = new HashMap<>();
        Map<String, Object> overrides = new HashMap<>();
        for (Map.Entry<String, ?> entry : brokerConfig.entrySet()) {
            String key = entry.getKey();
            if (key.startsWith(PRODUCER_PREFIX)) {
                overrides.put(key.substring(PRODUCER_PREFIX.length()), entry.getValue());
            } else if (key.startsWith(PREFIX)) {
                if (!DEFINITION.names().contains(key)) {
                    // Named, never its value: a misspelt producer property may hold a password.
                    throw new ConfigException(key + " is not a kcm receiver property; known: "
                            + String.join(", ", DEFINITION.names()) + " and " + PRODUCER_PREFIX + "*");
                }
                own.put(key, entry.getValue());
            } else if (key.startsWith(FAMILY_PREFIX)) {
                throw new ConfigException(key + " is not a kcm receiver property: they all start with " + PREFIX
                        + "; correct the prefix or remove the line");
            }
        }
        AbstractConfig parsed = new AbstractConfig(DEFINITION, own, false);
        List<String> unknownProducerKeys = new ArrayList<>();
        for (String key : new TreeSet<>(overrides.keySet())) {
            if (FIXED_PRODUCER_KEYS.contains(key)) {
                throw new ConfigException(PRODUCER_PREFIX + key
                        + ": the receiver writes bytes with its own serializers; remove this property");
            }
            checkProducerKey(key);
            if (!ProducerConfig.configNames().contains(key)) {
                unknownProducerKeys.add(PRODUCER_PREFIX + key);
            }
            checkProducerValue(key, overrides.get(key));
        }
        List<String> bootstrap = parsed.getList(BOOTSTRAP_SERVERS);
        Map<String, Object> producer = new HashMap<>();
        if (bootstrap.isEmpty() && !overrides.containsKey(CommonClientConfigs.BOOTSTRAP_SERVERS_CONFIG)) {
            BrokerListener listener = BrokerListener.choose(brokerConfig);
            producer.put(CommonClientConfigs.BOOTSTRAP_SERVERS_CONFIG, listener.address);
            producer.put(CommonClientConfigs.SECURITY_PROTOCOL_CONFIG, listener.securityProtocol);
        } else if (!bootstrap.isEmpty()) {
            checkAddresses(BOOTSTRAP_SERVERS, bootstrap);
            producer.put(CommonClientConfigs.BOOTSTRAP_SERVERS_CONFIG, String.join(",", bootstrap));
        }
        if (overrides.containsKey(CommonClientConfigs.BOOTSTRAP_SERVERS_CONFIG)) {
            String name = PRODUCER_PREFIX + CommonClientConfigs.BOOTSTRAP_SERVERS_CONFIG;
            Object value = overrides.get(CommonClientConfigs.BOOTSTRAP_SERVERS_CONFIG);
            @SuppressWarnings("unchecked")
            List<String> addresses = (List<String>) ConfigDef.parseType(name, value, Type.LIST);
            checkAddresses(name, addresses);
        }
        String nodeId = nodeId(brokerConfig);
        producer.put(ProducerConfig.CLIENT_ID_CONFIG, nodeId == null ? "kcm-receiver" : "kcm-receiver-" + nodeId);
        producer.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, true);
        producer.put(ProducerConfig.ACKS_CONFIG, "all");
        producer.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, "zstd");
        producer.put(ProducerConfig.LINGER_MS_CONFIG, 20);
        // The producer checks a record's uncompressed size against max.request.size (1 MiB by default), and the
        // broker hands over pushes decompressed: any push the queue can hold may be sent (zstd makes it far smaller).
        long queueMaxBytes = parsed.getLong(QUEUE_MAX_BYTES);
        producer.put(ProducerConfig.MAX_REQUEST_SIZE_CONFIG,
                (int) Math.max(DEFAULT_MAX_REQUEST_BYTES, Math.min(queueMaxBytes, Integer.MAX_VALUE)));
        // The plugin's own producer must not push telemetry into the broker that feeds it.
        producer.put(ProducerConfig.ENABLE_METRICS_PUSH_CONFIG, false);
        producer.put(CommonClientConfigs.RECONNECT_BACKOFF_MS_CONFIG, DEFAULT_RECONNECT_BACKOFF_MS);
        producer.put(CommonClientConfigs.RECONNECT_BACKOFF_MAX_MS_CONFIG, DEFAULT_RECONNECT_BACKOFF_MAX_MS);
        // Kafka 3.8 added the setting (rebootstrapping since 4.0 by default): an older broker's producer lacks it.
        if (ProducerConfig.configNames().contains(CommonClientConfigs.METADATA_RECOVERY_STRATEGY_CONFIG)) {
            producer.put(CommonClientConfigs.METADATA_RECOVERY_STRATEGY_CONFIG, DEFAULT_METADATA_RECOVERY_STRATEGY);
        }
        producer.putAll(overrides);
        producer.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        producer.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class.getName());
        checkProducer(producer);
        return new ReceiverConfig(parsed.getString(TOPIC), queueMaxBytes,
                parsed.getLong(CLOSE_TIMEOUT_MS), producer, List.copyOf(unknownProducerKeys));
    }

    /** Kafka's own topic-name rules: a name the cluster would refuse must fail start-up, not every push. */
    private static void checkTopic(String name, Object value) {
        try {
            Topic.validate(value == null ? "" : value.toString());
        } catch (InvalidTopicException e) {
            throw new ConfigException(name, value, e.getMessage());
        }
    }

    /** Whether {@code process.roles} names the controller role and not the broker one (a KRaft controller-only node). */
    static boolean controllerOnly(Map<String, ?> brokerConfig) {
        List<String> roles = new ArrayList<>();
        for (String role : BrokerListener.text(brokerConfig.get("process.roles")).split(",")) {
            if (!role.isBlank()) {
                roles.add(role.trim().toLowerCase(java.util.Locale.ROOT));
            }
        }
        return !roles.isEmpty() && !roles.contains("broker");
    }

    /**
     * The largest push the broker accepts: its {@code telemetry.max.bytes} (the configs a broker hands its metric
     * reporters are its originals, so the setting is there only when set), else Kafka's default; null when the value
     * is not a number (the broker refuses to start with it anyway).
     */
    static Long telemetryMaxBytes(Map<String, ?> brokerConfig) {
        Object value = brokerConfig.get(TELEMETRY_MAX_BYTES);
        if (value == null) {
            return KAFKA_DEFAULT_TELEMETRY_MAX_BYTES;
        }
        try {
            return ((Number) ConfigDef.parseType(TELEMETRY_MAX_BYTES, value, Type.INT)).longValue();
        } catch (ConfigException e) {
            return null;
        }
    }

    /** The broker's id from its properties (KRaft {@code node.id}, else {@code broker.id}); null when neither. */
    static String nodeId(Map<String, ?> brokerConfig) {
        Object id = brokerConfig.get("node.id");
        if (id == null) {
            id = brokerConfig.get("broker.id");
        }
        return id == null ? null : String.valueOf(id);
    }

    /**
     * The HOST:PORT syntax check KafkaProducer makes (ClientUtils.parseAndValidateAddresses), without resolving names:
     * the producer is built on the writer thread, which retries for names that do not resolve yet, but an address
     * without a valid port can never work and must fail start-up instead.
     */
    static void checkAddresses(String property, List<String> addresses) {
        boolean any = false;
        for (String address : addresses) {
            if (address == null || address.isBlank()) {
                continue;
            }
            any = true;
            String host = Utils.getHost(address);
            Integer port;
            try {
                port = Utils.getPort(address);
            } catch (NumberFormatException e) {
                port = null;
            }
            if (host == null || host.isEmpty() || port == null || port > 65535) {
                throw new ConfigException(property, address, "not a HOST:PORT address (port 0-65535)");
            }
        }
        if (!any) {
            throw new ConfigException(property, String.join(",", addresses), "no HOST:PORT address given");
        }
    }

    /**
     * A producer property Kafka does not know that is one or two letters from one it knows is a typo: the producer
     * would ignore it (a SASL or TLS setting falling back to its default), so start-up fails naming both, never the
     * value, and so is one that differs from a known name only in case. Other unknown names are left to the producer,
     * which passes them to plugins (interceptors, callbacks).
     */
    static void checkProducerKey(String key) {
        Set<String> known = ProducerConfig.configNames();
        if (known.contains(key)) {
            return;
        }
        for (String name : known) {
            if (name.equalsIgnoreCase(key)) {
                throw new ConfigException(PRODUCER_PREFIX + key + " is not a producer property (names are "
                        + "case-sensitive); did you mean " + PRODUCER_PREFIX + name + "?");
            }
        }
        if (key.length() < 6) {
            return;
        }
        for (String name : known) {
            if (Math.abs(name.length() - key.length()) <= 2 && editDistance(name, key, 2) <= 2) {
                throw new ConfigException(PRODUCER_PREFIX + key + " is not a producer property; did you mean "
                        + PRODUCER_PREFIX + name + "?");
            }
        }
    }

    /**
     * A known producer setting's value parsed and validated alone, as the producer will, so that a bad one is named by
     * its whole property ({@code kcm.receiver.producer.linger.ms}); settings that only fail together (acks with
     * idempotence) are left to {@link #checkProducer}. The producer's message quotes the value: never for a password.
     */
    static void checkProducerValue(String key, Object value) {
        ConfigDef.ConfigKey definition = ProducerConfig.configDef().configKeys().get(key);
        if (definition == null) {
            return;
        }
        try {
            Object parsed = ConfigDef.parseType(key, value, definition.type);
            if (definition.validator != null) {
                definition.validator.ensureValid(key, parsed);
            }
        } catch (ConfigException e) {
            throw new ConfigException(PRODUCER_PREFIX + key + ": " + (definition.type == Type.PASSWORD
                    ? "not a valid value (not shown: a password)" : e.getMessage()));
        }
    }

    /** Levenshtein distance of a and b, or limit + 1 once it is certainly above limit. */
    static int editDistance(String a, String b, int limit) {
        int[] previous = new int[b.length() + 1];
        int[] current = new int[b.length() + 1];
        for (int j = 0; j <= b.length(); j++) {
            previous[j] = j;
        }
        for (int i = 1; i <= a.length(); i++) {
            current[0] = i;
            int best = current[0];
            for (int j = 1; j <= b.length(); j++) {
                int substitute = previous[j - 1] + (a.charAt(i - 1) == b.charAt(j - 1) ? 0 : 1);
                current[j] = Math.min(substitute, Math.min(previous[j], current[j - 1]) + 1);
                best = Math.min(best, current[j]);
            }
            if (best > limit) {
                return limit + 1;
            }
            int[] swap = previous;
            previous = current;
            current = swap;
        }
        return previous[b.length()];
    }

    private static void checkProducer(Map<String, Object> producer) {
        try {
            new ProducerConfig(producer);
        } catch (ConfigException e) {
            throw new ConfigException(PRODUCER_PREFIX + "*: " + e.getMessage());
        }
        Object jaas = producer.get(SaslConfigs.SASL_JAAS_CONFIG);
        if (jaas != null) {
            // Read now, as the producer will: its error quotes the text it could not read, which for an unquoted
            // password with a blank (or a stray quote) is the rest of the password, and the writer thread would log
            // it at every retry. Said here without it.
            try {
                JaasContext.loadClientContext(Map.of(SaslConfigs.SASL_JAAS_CONFIG,
                        jaas instanceof Password ? jaas : new Password(jaas.toString())));
            } catch (IllegalArgumentException e) {
                throw new ConfigException(PRODUCER_PREFIX + SaslConfigs.SASL_JAAS_CONFIG + " cannot be read as one "
                        + "JAAS login module (the reason is not shown: it may quote the password); write it as "
                        + "org.apache.kafka.common.security.plain.PlainLoginModule required username=\"...\" "
                        + "password=\"...\"; with each value in double quotes (\\\" for a quote inside)");
            }
        }
    }

    /** The listener of this broker the internal producer uses when no bootstrap servers are given. */
    static final class BrokerListener {
        final String address;
        final String securityProtocol;

        private BrokerListener(String address, String securityProtocol) {
            this.address = address;
            this.securityProtocol = securityProtocol;
        }

        static BrokerListener choose(Map<String, ?> brokerConfig) {
            String listeners = text(brokerConfig.get("listeners"));
            if (listeners.isBlank()) {
                listeners = KAFKA_DEFAULT_LISTENERS; // what the broker itself listens on when `listeners` is not set
            }
            Map<String, String> protocols = protocolMap(text(brokerConfig.get("listener.security.protocol.map")));
            List<String> controllers = new ArrayList<>();
            for (String name : text(brokerConfig.get("controller.listener.names")).split(",")) {
                controllers.add(name.trim().toUpperCase());
            }
            String preferred = text(brokerConfig.get("inter.broker.listener.name"));
            if (preferred.isBlank()) {
                String protocol = text(brokerConfig.get("security.inter.broker.protocol"));
                preferred = protocol.isBlank() ? "PLAINTEXT" : protocol;
            }
            List<String[]> candidates = new ArrayList<>();
            for (String entry : listeners.split(",")) {
                entry = entry.trim();
                int scheme = entry.indexOf("://");
                if (scheme < 0) {
                    continue;
                }
                String name = entry.substring(0, scheme).trim().toUpperCase();
                if (!controllers.contains(name)) {
                    candidates.add(new String[] {name, hostPort(entry.substring(scheme + 3))});
                }
            }
            if (candidates.isEmpty()) {
                throw new ConfigException(BOOTSTRAP_SERVERS, "",
                        "no broker listener in 'listeners' to derive it from; set it to this cluster's bootstrap servers");
            }
            String[] chosen = candidates.get(0);
            for (String[] candidate : candidates) {
                if (candidate[0].equals(preferred.toUpperCase())) {
                    chosen = candidate;
                }
            }
            return new BrokerListener(chosen[1], protocols.getOrDefault(chosen[0], chosen[0]));
        }

        private static String hostPort(String address) {
            int colon = address.lastIndexOf(':');
            if (colon < 0 || address.endsWith("]")) {
                throw new ConfigException("listeners", address, "a listener without a port; fix `listeners` or set "
                        + BOOTSTRAP_SERVERS + " to this cluster's bootstrap servers");
            }
            String host = address.substring(0, colon);
            // A wildcard or empty bind host means every interface, so loopback reaches this broker.
            if (host.isEmpty() || host.equals("0.0.0.0") || host.equals("[::]") || host.equals("::")) {
                host = "localhost";
            }
            return host + address.substring(colon);
        }

        private static Map<String, String> protocolMap(String text) {
            Map<String, String> map = new HashMap<>();
            for (String pair : text.split(",")) {
                String[] parts = pair.split(":");
                if (parts.length == 2) {
                    map.put(parts[0].trim().toUpperCase(), parts[1].trim().toUpperCase());
                }
            }
            return map;
        }

        static String text(Object value) {
            if (value == null) {
                return "";
            }
            if (value instanceof List) {
                List<String> items = new ArrayList<>();
                for (Object item : (List<?>) value) {
                    items.add(String.valueOf(item));
                }
                return String.join(",", items);
            }
            return String.valueOf(value);
        }
    }
}
