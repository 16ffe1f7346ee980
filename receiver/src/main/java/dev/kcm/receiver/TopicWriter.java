package dev.kcm.receiver;

import java.time.Duration;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicLong;
import java.util.function.Consumer;
import java.util.function.LongFunction;
import java.util.function.LongSupplier;
import java.util.function.Supplier;

import org.apache.kafka.clients.producer.Producer;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.slf4j.Logger;
import org.slf4j.LoggerFactory;

/**
 * A queue bounded in bytes in front of one background producer; offering never blocks. The producer is built on the
 * writer thread, again with backoff while that fails (a bootstrap name that does not resolve yet must not stop the
 * broker from starting), and no push, however odd, ends that thread.
 */
final class TopicWriter implements AutoCloseable {
    private static final Logger LOG = LoggerFactory.getLogger(TopicWriter.class);
    private static final long FIRST_RETRY_MS = 1_000;
    private static final long LAST_RETRY_MS = 30_000;
    private static final long LOG_EVERY_MS = 10_000;

    interface RecordBuilder {
        ProducerRecord<byte[], byte[]> build(Push push);
    }

    private final Supplier<Producer<byte[], byte[]>> producerFactory;
    private final RecordBuilder builder;
    private final ReceiverMetrics metrics;
    private final long maxBytes;
    private final long closeTimeoutMs;
    private final LinkedBlockingQueue<Push> queue = new LinkedBlockingQueue<>();
    // Counts queued pushes and pushes the producer has not acknowledged yet: the producer's buffer is bounded too.
    private final AtomicLong heldBytes = new AtomicLong();
    private final Thread sender;
    private final PacedWarning writeFailures;
    private final PacedWarning queueFull;
    private final PacedWarning tooLarge;
    private volatile Producer<byte[], byte[]> producer;
    private volatile boolean closing;
    private final Object producerHandOver = new Object();
    private boolean producerClosed; // under producerHandOver: a producer built after close() is closed at once

    TopicWriter(Supplier<Producer<byte[], byte[]>> producerFactory, RecordBuilder builder, ReceiverMetrics metrics,
                long maxBytes, long closeTimeoutMs) {
        this(producerFactory, builder, metrics, maxBytes, closeTimeoutMs, System::currentTimeMillis);
    }

    /** For tests: the warnings are paced by `clockMs`. */
    TopicWriter(Supplier<Producer<byte[], byte[]>> producerFactory, RecordBuilder builder, ReceiverMetrics metrics,
                long maxBytes, long closeTimeoutMs, LongSupplier clockMs) {
        this.producerFactory = producerFactory;
        this.builder = builder;
        this.metrics = metrics;
        this.maxBytes = maxBytes;
        this.closeTimeoutMs = closeTimeoutMs;
        Consumer<String> warn = LOG::warn;
        writeFailures = new PacedWarning("could not be written to the metrics topic", clockMs, warn);
        String queueSetting = ReceiverConfig.QUEUE_MAX_BYTES + " (" + maxBytes + " bytes)";
        queueFull = new PacedWarning("dropped", clockMs, warn, last -> "the queue, " + queueSetting
                + ", was full: the metrics topic is written slower than clients push (its cluster slow or "
                + "unreachable: see the producer's warnings) or the queue is too small for this broker's pushes; "
                + "raise " + ReceiverConfig.QUEUE_MAX_BYTES + " if the metrics cluster keeps up");
        tooLarge = new PacedWarning("dropped", clockMs, warn, last -> "larger than the whole queue, " + queueSetting
                + " (the last one " + last + " bytes with its client's text), so never written; raise "
                + ReceiverConfig.QUEUE_MAX_BYTES + " above the largest push (the broker's telemetry.max.bytes, but "
                + "Kafka before 4.3.1 checks it against the compressed size only)");
        sender = new Thread(this::run, "kcm-receiver-writer");
        sender.setDaemon(true);
        sender.start();
    }

    long heldBytes() {
        return heldBytes.get();
    }

    /** Whether a push of `weight` bytes would fit now: checked before the request thread copies the payload. */
    boolean hasRoomFor(long weight) {
        return !closing && heldBytes.get() + weight <= maxBytes;
    }

    /**
     * Counts a push of `weight` bytes as dropped; one that did not fit is warned of (paced, so at most one line per
     * 10 s reaches the broker's log from the request thread, which never waits for another).
     */
    void drop(long weight) {
        metrics.pushesDropped.increment();
        if (closing) {
            return;
        }
        if (weight > maxBytes) {
            tooLarge.occurred(weight);
        } else {
            queueFull.occurred(weight);
        }
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
            drop(weight);
            return false;
        }
        queue.add(push);
        // close() may have set `closing` and emptied the queue since the check above: take the push back and count
        // it, or it would stay in a queue nobody reads, neither written nor dropped. (Either this or close's drain
        // sees it: both read `closing` after their own write.)
        if (closing && queue.remove(push)) {
            heldBytes.addAndGet(-weight);
            metrics.pushesDropped.increment();
            return false;
        }
        return true;
    }

    private void run() {
        long retryMs = FIRST_RETRY_MS;
        while (producer == null && !closing) {
            try {
                Producer<byte[], byte[]> built = producerFactory.get();
                synchronized (producerHandOver) {
                    if (producerClosed) {
                        built.close(Duration.ZERO);
                        return;
                    }
                    producer = built;
                }
            } catch (RuntimeException e) {
                LOG.warn("kcm receiver: cannot create the producer for the metrics topic yet ({}); pushes queue up "
                        + "(and are dropped once the queue is full) until it can, retrying in {} ms", causes(e),
                        retryMs);
                try {
                    Thread.sleep(retryMs);
                } catch (InterruptedException interrupted) {
                    return;
                }
                warnHeldBack();
                retryMs = Math.min(LAST_RETRY_MS, retryMs * 2);
            }
        }
        if (producer == null) {
            return; // closed before a producer could be built: close() counts what is queued as dropped
        }
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
            warnHeldBack();
        }
    }

    /** Logs the counts held back by the pacing once it allows: the last failures or drops of a burst are said too. */
    private void warnHeldBack() {
        writeFailures.flush(false);
        queueFull.flush(false);
        tooLarge.flush(false);
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
                    writeFailures.occurred(error.toString());
                }
            });
        // The producer throws when its buffer stays full beyond max.block.ms or it is closed; a broker older than the
        // API compiled against throws a LinkageError from the record's headers. Count it and go on with the next.
        } catch (RuntimeException | LinkageError e) {
            heldBytes.addAndGet(-weight);
            metrics.producerErrors.increment();
            writeFailures.occurred("not handed to the producer: " + e);
        }
    }

    /** Waits up to the close timeout in all (0: not at all) for held pushes; what is still queued is counted dropped. */
    @Override
    public void close() {
        closing = true;
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(closeTimeoutMs);
        // A producer still being built (the first moments after start-up) is waited for too: it then writes what is
        // queued. One that cannot be built ends the wait at the next retry.
        if (closeTimeoutMs > 0) {
            try {
                sender.join(closeTimeoutMs);
            } catch (InterruptedException e) {
                Thread.currentThread().interrupt();
            }
        }
        sender.interrupt();
        long left = 0;
        for (Push push = queue.poll(); push != null; push = queue.poll()) {
            heldBytes.addAndGet(-push.weight());
            metrics.pushesDropped.increment();
            left++;
        }
        if (left > 0) {
            LOG.warn("kcm receiver: closing: {} queued push(es) not written within {} ({} ms) were dropped", left,
                    ReceiverConfig.CLOSE_TIMEOUT_MS, closeTimeoutMs);
        }
        Producer<byte[], byte[]> current;
        synchronized (producerHandOver) {
            producerClosed = true;
            current = producer;
        }
        if (current != null) {
            current.close(Duration.ofNanos(Math.max(0, deadline - System.nanoTime())));
        }
        // What the producer failed while closing, and what the pacing still held back, is said now or never.
        writeFailures.flush(true);
        queueFull.flush(true);
        tooLarge.flush(true);
    }

    /** An exception and its causes, each once: "Failed to construct kafka producer" alone does not say why. */
    static String causes(Throwable error) {
        StringBuilder text = new StringBuilder(described(error));
        java.util.Set<Throwable> seen = java.util.Collections.newSetFromMap(new java.util.IdentityHashMap<>());
        seen.add(error);
        for (Throwable cause = error.getCause(); cause != null && seen.add(cause); cause = cause.getCause()) {
            text.append("; caused by ").append(described(cause));
        }
        return text.toString();
    }

    /** An exception as its toString, but a JAAS parse error quoting the text it could not read (Kafka's JaasConfig:
     *  "Value not specified for key '…'", "Invalid login module control flag '…'") without its message: that text
     *  can be part of a password. */
    private static String described(Throwable error) {
        String message = String.valueOf(error.getMessage());
        if (error instanceof IllegalArgumentException && message.contains("' in JAAS config")) {
            return error.getClass().getName()
                    + ": sasl.jaas.config cannot be read (not shown: it may quote a password)";
        }
        return error.toString();
    }

    /**
     * One WARN line per 10 s at most for one kind of event, saying how many happened since the line before: an outage
     * must not flood the log. Taking an event never waits: the request thread drops pushes through it.
     */
    static final class PacedWarning {
        private final String verb;
        private final LongSupplier clockMs;
        private final Consumer<String> out;
        /** The line's reason from the last event's detail; null: the detail is the reason (an error's text). */
        private final LongFunction<String> reason;
        private final AtomicLong nextMs = new AtomicLong(Long.MIN_VALUE);
        private final AtomicLong pending = new AtomicLong();
        private volatile Object lastDetail;
        private volatile boolean warned;

        PacedWarning(String verb, LongSupplier clockMs, Consumer<String> out) {
            this(verb, clockMs, out, null);
        }

        PacedWarning(String verb, LongSupplier clockMs, Consumer<String> out, LongFunction<String> reason) {
            this.verb = verb;
            this.clockMs = clockMs;
            this.out = out;
            this.reason = reason;
        }

        /** Counts one event (`detail`: an error's text, or a size for the reason); logs it if the pacing allows. */
        void occurred(Object detail) {
            lastDetail = detail;
            pending.incrementAndGet();
            flush(false);
        }

        /** Logs the events not said yet: once 10 s have passed since the last line, or at once when `now`. */
        void flush(boolean now) {
            if (pending.get() == 0) {
                return;
            }
            if (!now) {
                long time = clockMs.getAsLong();
                long next = nextMs.get();
                if (time < next || !nextMs.compareAndSet(next, time + LOG_EVERY_MS)) {
                    return;
                }
            }
            long count = pending.getAndSet(0);
            if (count == 0) {
                return;
            }
            Object detail = lastDetail;
            String why = reason == null ? (count > 1 ? "the last: " : "") + detail
                    : reason.apply(detail instanceof Long size ? size : 0);
            out.accept("kcm receiver: " + count + (count == 1 ? " push " : " pushes ") + verb
                    + (warned ? " since the last such warning" : "") + ": " + why);
            warned = true;
        }
    }
}
