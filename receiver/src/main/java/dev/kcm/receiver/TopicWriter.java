package dev.kcm.receiver;

import java.time.Duration;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;

import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/** A queue bounded in bytes in front of one background producer; offering never blocks. */
final class TopicWriter implements AutoCloseable {
    private static final Logger LOG = LoggerFactory.getLogger(TopicWriter.class);

    interface RecordBuilder {
        ProducerRecord<byte[], byte[]> build(Push push);
    }

    private final Producer<byte[], byte[]> producer;
    private final RecordBuilder builder;
    private final ReceiverMetrics metrics;
    private final long maxBytes;
    private final long closeTimeoutMs;
    private final LinkedBlockingQueue<Push> queue = new LinkedBlockingQueue<>();
    // Counts queued pushes and pushes the producer has not acknowledged yet: the producer's buffer is bounded too.
    private final AtomicLong heldBytes = new AtomicLong();
    private final Thread sender;
    private volatile boolean closing;

    TopicWriter(Producer<byte[], byte[]> producer, RecordBuilder builder, ReceiverMetrics metrics, long maxBytes,
                long closeTimeoutMs) {
        this.producer = producer;
        this.builder = builder;
        this.metrics = metrics;
        this.maxBytes = maxBytes;
        this.closeTimeoutMs = closeTimeoutMs;
        sender = new Thread(this::run, "kcm-receiver-writer");
        sender.setDaemon(true);
        sender.start();
    }

    long heldBytes() {
        return heldBytes.get();
    }

    /** Queues the push, or drops and counts it when the queue is full or closing; returns whether it was queued. */
    boolean offer(Push push) {
        long weight = push.weight();
        if (closing) {
            metrics.pushesDropped.increment();
            return false;
        }
        if (heldBytes.addAndGet(weight) > maxBytes) {
            heldBytes.addAndGet(-weight);
            metrics.pushesDropped.increment();
            return false;
        }
        queue.add(push);
        return true;
    }

    private void run() {
        while (!closing || !queue.isEmpty()) {
            Push push;
            try {
                push = queue.poll(100, TimeUnit.MILLISECONDS);
            } catch (InterruptedException e) {
                break;
            }
            if (push != null) {
                send(push);
            }
        }
    }

    private void send(Push push) {
        long weight = push.weight();
        try {
            producer.send(builder.build(push), (metadata, error) -> {
                heldBytes.addAndGet(-weight);
                if (error == null) {
                    metrics.pushesWritten.increment();
                    metrics.bytesWritten.add(push.data.length);
                } else {
                    metrics.producerErrors.increment();
                    LOG.warn("kcm receiver: a push could not be written to the metrics topic: {}", error.toString());
                }
            });
        // The producer throws when its buffer stays full beyond max.block.ms or it is closed: count and go on.
        } catch (RuntimeException e) {
            heldBytes.addAndGet(-weight);
            metrics.producerErrors.increment();
            LOG.warn("kcm receiver: a push could not be handed to the producer: {}", e.toString());
        }
    }

    @Override
    public void close() {
        closing = true;
        try {
            sender.join(closeTimeoutMs);
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
        }
        sender.interrupt();
        producer.close(Duration.ofMillis(closeTimeoutMs));
    }
}
