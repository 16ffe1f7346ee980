package dev.kcm.receiver;

import java.util.List;
import java.util.Map;

import org.apache.kafka.common.metrics.KafkaMetric;
import org.apache.kafka.common.metrics.MetricsContext;
import org.apache.kafka.common.metrics.MetricsReporter;

/** What both plugin classes are to the broker as a {@code MetricsReporter}: the core's lifecycle; Kafka's own metrics are not reported. */
abstract class ReceiverReporter implements MetricsReporter {
    protected final ReceiverCore core;

    ReceiverReporter(ReceiverCore core) {
        this.core = core;
    }

    @Override
    public void configure(Map<String, ?> configs) {
        core.configure(configs);
    }

    @Override
    public void contextChange(MetricsContext context) {
        core.contextChange(context);
    }

    @Override
    public void init(List<KafkaMetric> metrics) {
    }

    @Override
    public void metricChange(KafkaMetric metric) {
    }

    @Override
    public void metricRemoval(KafkaMetric metric) {
    }

    @Override
    public void close() {
        core.close();
    }

    ReceiverCore core() {
        return core;
    }
}
