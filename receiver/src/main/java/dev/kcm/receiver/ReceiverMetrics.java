package dev.kcm.receiver;

import java.util.ArrayList;
import java.util.HashSet;
import java.util.Map;
import java.util.Set;
import java.util.concurrent.atomic.LongAdder;
import java.util.function.LongSupplier;

import org.apache.kafka.common.metrics.JmxReporter;
import org.apache.kafka.common.metrics.KafkaMetricsContext;
import org.apache.kafka.common.metrics.Measurable;
import org.apache.kafka.common.metrics.MetricConfig;
import org.apache.kafka.common.metrics.Metrics;
import org.apache.kafka.common.utils.Time;

/** The plugin's counters, exposed over JMX as {@code kafka.server:type=kcm-receiver} beside the broker's own. */
public final class ReceiverMetrics implements AutoCloseable {
    public static final String JMX_PREFIX = "kafka.server";
    public static final String GROUP = "kcm-receiver";
    /** The MBean key that tells a second live plugin instance in one JVM from the first. */
    public static final String INSTANCE_TAG = "instance";
    // Instance numbers in use in this JVM: the first instance keeps the bare MBean name dashboards use; another one
    // (both plugin classes listed, as during a move to Kafka 4.2's interface) gets instance=2, … so that neither
    // replaces the other's MBean nor unregisters it on close.
    private static final Set<Integer> LIVE = new HashSet<>();

    final LongAdder pushesReceived = new LongAdder();
    final LongAdder bytesReceived = new LongAdder();
    final LongAdder pushesWritten = new LongAdder();
    final LongAdder bytesWritten = new LongAdder();
    final LongAdder pushesDropped = new LongAdder();
    final LongAdder pushesEmpty = new LongAdder();
    final LongAdder producerErrors = new LongAdder();
    final LongAdder exportErrors = new LongAdder();

    private final Metrics registry;
    /** 1 for the first live instance in this JVM, 2 for a second one, … */
    final int instance;
    private final Map<String, String> tags;
    private boolean released; // under LIVE

    ReceiverMetrics(LongSupplier queuedBytes) {
        instance = claimInstance();
        tags = instance == 1 ? Map.of() : Map.of(INSTANCE_TAG, String.valueOf(instance));
        // Counters are LongAdders read on demand, so the request thread never takes a sensor lock.
        KafkaMetricsContext context = new KafkaMetricsContext(JMX_PREFIX);
        registry = new Metrics(new MetricConfig(), new ArrayList<>(), Time.SYSTEM, context);  // reporters added below
        // Every registry has a kafka-metrics-count metric. Under the broker's JMX prefix ours would replace the
        // broker's MBean of that name, and JmxReporter's close unregisters it whoever registered it last: so it is
        // removed before the JMX reporter is added.
        registry.removeMetric(registry.metricName("count", "kafka-metrics-count"));
        add("pushes-received-total", "Client pushes handed to the plugin by the broker.", pushesReceived::sum);
        add("bytes-received-total", "Bytes of pushes handed to the plugin.", bytesReceived::sum);
        add("pushes-written-total", "Pushes acknowledged by the metrics topic.", pushesWritten::sum);
        add("bytes-written-total", "Bytes of pushes acknowledged by the metrics topic.", bytesWritten::sum);
        add("pushes-dropped-total",
                "Pushes dropped: the queue full, the push larger than all of it, or the plugin closing.",
                pushesDropped::sum);
        add("pushes-empty-total",
                "Pushes without metrics (a subscription selecting none of the client's), not written.",
                pushesEmpty::sum);
        add("producer-errors-total", "Pushes the internal producer failed to write.", producerErrors::sum);
        add("export-errors-total", "Pushes that failed inside the plugin before reaching the queue.", exportErrors::sum);
        add("queue-bytes", "Bytes of pushes waiting to be written.", queuedBytes);
        JmxReporter jmx = new JmxReporter();
        jmx.contextChange(context);
        registry.addReporter(jmx);
    }

    private void add(String name, String description, LongSupplier value) {
        registry.addMetric(registry.metricName(name, GROUP, description, tags),
                (Measurable) (config, now) -> value.getAsLong());
    }

    /** Kafka's registry, for tests and for reading every value by name. */
    public Metrics registry() {
        return registry;
    }

    private static int claimInstance() {
        synchronized (LIVE) {
            int number = 1;
            while (LIVE.contains(number)) {
                number++;
            }
            LIVE.add(number);
            return number;
        }
    }

    @Override
    public void close() {
        registry.close();
        synchronized (LIVE) {
            if (!released) {   // a second close must not free a number another instance has claimed since
                released = true;
                LIVE.remove(instance);
            }
        }
    }
}
