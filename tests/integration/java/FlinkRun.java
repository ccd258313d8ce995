// Runs a Flink job's main() on an in-process MiniCluster (the wheel ships Flink's runtime but no
// flink-dist/flink-clients, so there is no `flink run` here): every StreamExecutionEnvironment the job
// asks for submits to this MiniCluster.  Usage: FlinkRun MAIN_CLASS ARGS... [--then MAIN_CLASS ARGS...]
// runs the mains one after the other on one MiniCluster.  The jobs' PrintSinks write to stdout; this
// program adds {"type":"finished","run":i} when a main returns, or {"type":"cancelled","run":i} when
// "stop" was read on stdin (how test_flink.py ends an unbounded job), which also ends the program.
import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import org.apache.flink.api.common.JobExecutionResult;
import org.apache.flink.api.common.JobStatus;
import org.apache.flink.configuration.Configuration;
import org.apache.flink.configuration.RestOptions;
import org.apache.flink.runtime.client.JobStatusMessage;
import org.apache.flink.runtime.minicluster.MiniCluster;
import org.apache.flink.runtime.minicluster.MiniClusterConfiguration;
import org.apache.flink.streaming.api.environment.StreamExecutionEnvironment;
import org.apache.flink.streaming.api.graph.StreamGraph;

public final class FlinkRun {

    static final class MiniClusterEnvironment extends StreamExecutionEnvironment {
        private final MiniCluster cluster;

        MiniClusterEnvironment(MiniCluster cluster, Configuration configuration) {
            super(configuration);
            this.cluster = cluster;
        }

        @Override
        public JobExecutionResult execute(StreamGraph streamGraph) throws Exception {
            return cluster.executeJobBlocking(streamGraph.getJobGraph(Thread.currentThread().getContextClassLoader()));
        }

        static void install(MiniCluster cluster) {
            initializeContextEnvironment(conf -> new MiniClusterEnvironment(cluster, conf));
        }
    }

    public static void main(String[] argv) throws Exception {
        Configuration conf = new Configuration();
        conf.set(RestOptions.BIND_ADDRESS, "127.0.0.1");
        MiniCluster cluster = new MiniCluster(new MiniClusterConfiguration.Builder()
                .setConfiguration(conf).setNumTaskManagers(1).setNumSlotsPerTaskManager(2)
                .withRandomPorts().build());
        cluster.start();
        MiniClusterEnvironment.install(cluster);
        AtomicBoolean stopped = new AtomicBoolean(false);
        Thread stopper = new Thread(() -> {
            try (BufferedReader in = new BufferedReader(new InputStreamReader(System.in, StandardCharsets.UTF_8))) {
                String line;
                while ((line = in.readLine()) != null) {
                    if (line.trim().equals("stop")) {
                        stopped.set(true);
                        for (JobStatusMessage job : cluster.listJobs().get(30, TimeUnit.SECONDS)) {
                            if (!job.getJobState().isGloballyTerminalState()) {
                                cluster.cancelJob(job.getJobId()).get(30, TimeUnit.SECONDS);
                            }
                        }
                        return;
                    }
                }
            } catch (Exception exc) {
                exc.printStackTrace();
            }
        }, "stdin-stop");
        stopper.setDaemon(true);
        stopper.start();
        List<List<String>> runs = new ArrayList<>();
        runs.add(new ArrayList<>());
        for (String arg : argv) {
            if (arg.equals("--then")) {
                runs.add(new ArrayList<>());
            } else {
                runs.get(runs.size() - 1).add(arg);
            }
        }
        int code = 0;
        try {
            for (int i = 0; i < runs.size() && !stopped.get(); i++) {
                List<String> run = runs.get(i);
                try {
                    Class.forName(run.get(0)).getMethod("main", String[].class)
                            .invoke(null, (Object) run.subList(1, run.size()).toArray(new String[0]));
                    System.out.println("{\"type\":\"finished\",\"run\":" + i + "}");
                } catch (java.lang.reflect.InvocationTargetException exc) {
                    if (!stopped.get()) {
                        exc.getCause().printStackTrace();
                        code = 1;
                        break;
                    }
                    System.out.println("{\"type\":\"cancelled\",\"run\":" + i + "}");
                }
                System.out.flush();
            }
        } finally {
            System.out.flush();
            cluster.closeAsync().get(60, TimeUnit.SECONDS);
        }
        System.exit(code);
    }
}
