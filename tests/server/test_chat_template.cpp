// Chat template rendering (exact strings), detection from GGUF Jinja text, and the stop
// strings each template needs with a real vocabulary.
#include <gtest/gtest.h>

#include "flashdllm/generator.h"
#include "server/chat_template.h"
#include "test_support.h"

namespace fdl::server {
namespace {

const std::vector<ChatMessage> kConversation = {
    {"system", "You are terse."},
    {"user", "Hi"},
    {"assistant", "Hello."},
    {"user", " Bye "},
};

TEST(ChatTemplate, Llama2) {
  EXPECT_EQ(render_chat(ChatTemplate::Llama2, kConversation),
            "[INST] <<SYS>>\nYou are terse.\n<</SYS>>\n\nHi [/INST] Hello. </s><s>[INST]  Bye  [/INST]");
  EXPECT_EQ(render_chat(ChatTemplate::Llama2, {{"user", "Q"}}), "[INST] Q [/INST]");
}

TEST(ChatTemplate, Llama3TrimsContent) {
  EXPECT_EQ(render_chat(ChatTemplate::Llama3, kConversation),
            "<|start_header_id|>system<|end_header_id|>\n\nYou are terse.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\nHello.<|eot_id|>"
            "<|start_header_id|>user<|end_header_id|>\n\nBye<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplate, ChatML) {
  EXPECT_EQ(render_chat(ChatTemplate::ChatML, kConversation),
            "<|im_start|>system\nYou are terse.<|im_end|>\n"
            "<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello.<|im_end|>\n"
            "<|im_start|>user\n Bye <|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplate, NamesAndDetection) {
  for (const auto t : {ChatTemplate::Llama2, ChatTemplate::Llama3, ChatTemplate::ChatML}) {
    EXPECT_EQ(parse_chat_template_name(chat_template_name(t)), t);
  }
  EXPECT_FALSE(parse_chat_template_name("vicuna").has_value());
  EXPECT_EQ(detect_chat_template("{% for m in messages %}{{'<|im_start|>' + m['role'] }}{% endfor %}"),
            ChatTemplate::ChatML);
  EXPECT_EQ(detect_chat_template("{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>' }}"),
            ChatTemplate::Llama3);
  EXPECT_EQ(detect_chat_template("{{ bos_token + '[INST] ' + content + ' [/INST]' }}"), ChatTemplate::Llama2);
  EXPECT_FALSE(detect_chat_template("").has_value());
  EXPECT_FALSE(detect_chat_template("{{ messages }}").has_value());
}

// stories260K's vocabulary has </s> (EOS) but no ChatML/Llama-3 markers: the engine stops on
// EOS by itself, and the other markers become stop strings.
TEST(ChatTemplate, StopStringsFollowTheVocabulary) {
  const LoadedModel m = load_model(test::model_path("stories260K.gguf"), ModelOptions{.n_threads = 1});
  EXPECT_TRUE(template_stop_strings(ChatTemplate::Llama2, *m.tokenizer).empty());
  EXPECT_EQ(template_stop_strings(ChatTemplate::ChatML, *m.tokenizer), std::vector<std::string>{"<|im_end|>"});
  EXPECT_EQ(template_stop_strings(ChatTemplate::Llama3, *m.tokenizer), std::vector<std::string>{"<|eot_id|>"});
  // Rendered Llama-2 text encodes "</s>" in history as the EOS token (parse_special).
  const auto ids = encode_prompt(*m.tokenizer, render_chat(ChatTemplate::Llama2, kConversation), true);
  EXPECT_NE(std::find(ids.begin(), ids.end(), m.tokenizer->eos_id()), ids.end());
}

}  // namespace
}  // namespace fdl::server
