package dev.kcm.receiver;

import java.nio.ByteBuffer;
import java.util.Map;
import java.util.function.Function;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.common.metrics.MetricsContext;
import org.apache.kafka.server.authorizer.AuthorizableRequestContext;
import org.apache.kafka.server.telemetry.ClientTelemetryPayload;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/** What both plugin classes do; it names no Kafka 4.2 type, so the 3.7–4.1 class loads on brokers that lack them. */
final class ReceiverCore implements AutoCloseable {
    private static final Logger LOG = LoggerFactory.getLogger(ReceiverCore.class);
    static final String CLUSTER_ID_LABEL = "kafka.cluster.id";
    static final String BROKER_ID_LABEL = "kafka.broker.id";
    /** What KRaft brokers (every Kafka 4.x broker) label themselves with instead (Server.createKafkaMetricsContext). */
    static final String NODE_ID_LABEL = "kafka.node.id";

    private final Function<Map<String, Object>, Producer<byte[], byte[]>> producerFactory;
    private volatile ReceiverConfig config;
    private volatile ReceiverMetrics metrics;
    private volatile TopicWriter writer;
    private volatile String brokerId;
    private volatile String clusterId;

    ReceiverCore() {
        this(KafkaProducer::new);
    }

    /** For tests: the producer comes from the factory (Kafka's MockProducer, a producer to a dead address). */
    ReceiverCore(Function<Map<String, Object>, Producer<byte[], byte[]>> producerFactory) {
        this.producerFactory = producerFactory;
    }

    void configure(Map<String, ?> brokerConfig) {
        close();
        if (ReceiverConfig.controllerOnly(brokerConfig)) {
            // Clients push to brokers only; one config for every node (as Strimzi applies it) must not stop these.
            LOG.info("kcm receiver: this node is a KRaft controller only (process.roles={}): no client pushes here, "
                    + "the plugin stays idle", brokerConfig.get("process.roles"));
            return;
        }
        ReceiverConfig parsed = ReceiverConfig.parse(brokerConfig);
        for (String key : parsed.unknownProducerKeys) {
            // Named, never its value (it may be a secret); Kafka itself only says "not used" at INFO.
            LOG.warn("kcm receiver: {} is not a Kafka producer property; passed on for producer plugins "
                    + "(interceptors, callbacks): remove it if it is a typo", key);
        }
        if (brokerId == null) {
            brokerId = ReceiverConfig.nodeId(brokerConfig);
        }
        ReceiverMetrics newMetrics = new ReceiverMetrics(this::queuedBytes);
        config = parsed;
        metrics = newMetrics;
        // The producer is built on the writer thread: a Kafka name that does not resolve yet must not stop the broker.
        writer = new TopicWriter(() -> producerFactory.apply(parsed.producerConfig),
                push -> ContractRecord.build(parsed.topic, push, brokerId, clusterId),
                newMetrics, parsed.queueMaxBytes, parsed.closeTimeoutMs);
        LOG.info("kcm receiver: writing client pushes to topic {} via {}", parsed.topic,
                parsed.producerConfig.get("bootstrap.servers"));
        Long telemetryMaxBytes = ReceiverConfig.telemetryMaxBytes(brokerConfig);
        if (telemetryMaxBytes != null && telemetryMaxBytes + Push.OVERHEAD > parsed.queueMaxBytes) {
            // A push counts its data, 256 bytes and its client's text against the queue (Push.weightOf).
            LOG.warn("kcm receiver: the broker accepts pushes of up to {} bytes ({}), but {} is {} bytes: a push "
                    + "larger than the whole queue (its data, 256 bytes and its client's text) is always dropped; "
                    + "raise {} above {}", telemetryMaxBytes, ReceiverConfig.TELEMETRY_MAX_BYTES,
                    ReceiverConfig.QUEUE_MAX_BYTES, parsed.queueMaxBytes, ReceiverConfig.QUEUE_MAX_BYTES,
                    ReceiverConfig.TELEMETRY_MAX_BYTES);
        }
        if (newMetrics.instance > 1) {
            LOG.warn("kcm receiver: {} kcm receiver plugins run in this broker (metric.reporters lists both "
                    + "KcmClientTelemetry and KcmTelemetryExporter?): Kafka 4.2+ hands every push to each, so it is "
                    + "written that many times; list one. This one's metrics: {}:type={},{}={}", newMetrics.instance,
                    ReceiverMetrics.JMX_PREFIX, ReceiverMetrics.GROUP, ReceiverMetrics.INSTANCE_TAG,
                    newMetrics.instance);
        }
    }

    void contextChange(MetricsContext context) {
        Map<String, String> labels = context.contextLabels();
        if (labels.containsKey(CLUSTER_ID_LABEL)) {
            clusterId = labels.get(CLUSTER_ID_LABEL);
        }
        if (labels.containsKey(BROKER_ID_LABEL)) {
            brokerId = labels.get(BROKER_ID_LABEL);
        } else if (labels.containsKey(NODE_ID_LABEL)) {
            brokerId = labels.get(NODE_ID_LABEL);
        }
    }

    /** Called on the broker's request thread: copies the data and queues it; never throws. */
    void export(AuthorizableRequestContext context, ClientTelemetryPayload payload, Integer pushIntervalMs) {
        ReceiverMetrics counters = metrics;
        TopicWriter queue = writer;
        if (counters == null || queue == null) {
            return;
        }
        // Counted first, whatever follows: received = written + dropped + empty + producer and export errors.
        counters.pushesReceived.increment();
        try {
            // 4.x hands a view of the request buffer, reused once this call returns: copy it now, if it fits.
            ByteBuffer data = payload.data().duplicate();
            counters.bytesReceived.add(data.remaining());
            if (!data.hasRemaining()) {
                // A Java client whose subscription selects none of its metrics pushes an empty MetricsData every
                // interval: a record of it would hold nothing, and readers count an empty value as undecodable.
                counters.pushesEmpty.increment();
                return;
            }
            long weight = Push.weightOf(data.remaining(), context);
            if (!queue.hasRoomFor(weight)) {
                queue.drop(weight);
                return;
            }
            byte[] copy = new byte[data.remaining()];
            data.get(copy);
            queue.offer(new Push(context, payload.clientInstanceId(), payload.isTerminating(), payload.contentType(),
                    copy, pushIntervalMs));
        // Anything escaping here would make the broker answer the client INVALID_RECORD.
        } catch (Throwable error) {
            exportFailed(error);
        }
    }

    /** A push whose context could not be read, before {@link #export} took it: received, and an export error. */
    void unreadableContext(Throwable error) {
        ReceiverMetrics counters = metrics;
        if (counters != null) {
            counters.pushesReceived.increment();
        }
        exportFailed(error);
    }

    void exportFailed(Throwable error) {
        ReceiverMetrics counters = metrics;
        if (counters != null) {
            counters.exportErrors.increment();
        }
        LOG.debug("kcm receiver: could not take a push", error);
    }

    ReceiverMetrics metrics() {
        return metrics;
    }

    private long queuedBytes() {
        TopicWriter current = writer;
        return current == null ? 0 : current.heldBytes();
    }

    @Override
    public void close() {
        TopicWriter oldWriter = writer;
        ReceiverMetrics oldMetrics = metrics;
        writer = null;
        metrics = null;
        if (oldWriter != null) {
            oldWriter.close();
        }
        if (oldMetrics != null) {
            oldMetrics.close();
        }
    }
}
